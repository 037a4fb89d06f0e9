"""A serving loop through lost ranks on 3 simulated hosts (`megamoe launch --hosts 3`, root):
host 0 killed with the root on it (3 x 1), a host cut off (3 x 2: its 2 ranks are the smaller
side and stop with PEER_LOST, the 4 others serve on), a rank killed on a host with a peer that
sees it die (3 x 2). Checks: survive_util.py. Run by CTest (label hosts); skips without root."""
import os
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "tools"))
from hosts_util import needs_root  # noqa: E402
from survive_util import check_survivors, run_loop  # noqa: E402

# One schedule before and after the loss: auto would serve on the O1 executor until the loss and
# on the host-scheduled path after it (masked calls), whose first scratch then shows as RSS
# growth that is not kept per loss (the 4-rank repeated-loss case checks that under auto).
HOST = {"MEGAMOE_SERVE_SCHEDULE": "host"}
# The resident set is held to the same 2 MB as on one host (survive_util.py): it stays flat
# across hosts since the engine's staging ring restarts at its beginning when drained (before,
# the loop's RSS crept up by the ring's 32 MiB; test_shmem_wire checks the ring).
RSS_SLACK_MB = 2.0


@needs_root
def test_host_of_the_root_killed(tmp_path):
    r, rows = run_loop(tmp_path, 3, ["kill-host:0@2"], 5.0, hosts=3, env_extra=HOST)
    check_survivors(r, rows, victims=[0], rss_slack_mb=RSS_SLACK_MB)


@needs_root
def test_host_cut_off(tmp_path):
    r, rows = run_loop(tmp_path, 6, ["cut-host:1@2"], 8.0, hosts=3, env_extra=HOST)
    serving = check_survivors(r, rows, victims=[], stopped=[2, 3], rss_slack_mb=RSS_SLACK_MB)
    assert {row["rank"] for row in serving} == {0, 1, 4, 5}
    for row in serving:
        assert row["losses"][0]["kind"] == "cut"


@needs_root
def test_rank_killed_on_a_host_with_a_peer(tmp_path):
    r, rows = run_loop(tmp_path, 6, ["kill-rank:3@2"], 5.0, hosts=3, env_extra=HOST)
    check_survivors(r, rows, victims=[3], rss_slack_mb=RSS_SLACK_MB)
