"""A serving loop through lost ranks on one host (4 ranks): the root killed; two ranks killed
one after the other (repeated losses: descriptors and resident set flat). Helpers and the
checks: survive_util.py; the same on simulated hosts (kill-host, cut-host): hosts_survive_cases.py."""
from survive_util import check_survivors, run_loop


def test_root_killed_in_a_serving_loop(tmp_path, megamoe_bin):
    r, rows = run_loop(tmp_path, 4, ["kill-rank:0@1.5"], 4.0)
    check_survivors(r, rows, victims=[0])


def test_two_ranks_killed_one_after_the_other(tmp_path, megamoe_bin):
    r, rows = run_loop(tmp_path, 4, ["kill-rank:2@1.5", "kill-rank:1@3.0"], 5.0)
    serving = check_survivors(r, rows, victims=[1, 2], losses=2)
    assert {row["rank"] for row in serving} == {0, 3}
