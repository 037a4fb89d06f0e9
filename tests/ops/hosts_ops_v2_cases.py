"""DispatchV2 / CombineV2 / CombineAddRmsNorm with ranks on simulated hosts (`megamoe launch
--hosts 2`): every randomised case of v2_cases.py for 2 and 4 ranks (every comm_alg, quant_mode
0-4, comm_quant_mode 0/2/3/4, TP, shared/special experts, elastic, hierarchy with groups inside,
equal to and across hosts) at 2 hosts x 1 rank and 2 hosts x 2 ranks, each output compared bit
for bit with the numpy model (v2_ref.py), as on one host; plus `hierarchy` with
MEGAMOE_RANKS_PER_NODE unset, whose groups must be the hosts. Run by CTest (labels ops, hosts);
needs root and skips without.
"""
import json
import os
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "tools"))
from hosts_util import PY, Launch, assert_nothing_left, needs_python_library, needs_root  # noqa: E402
from v2_cases import CASES, _c  # noqa: E402

pytestmark = needs_python_library

# hier "host": comm_alg hierarchy without MEGAMOE_RANKS_PER_NODE, the model grouping the ranks
# of each host (v2_worker.py); combine's fp32 re-association (and add_rms_norm's rstd) shows
# the grouping in the bits.
HOST_CASES = [
    _c("hosts_hierarchy_groups_are_hosts", W=4, E=8, K=3, H=40, bs=5, hier="host", ws=True),
    _c("hosts_arn_hierarchy_groups_are_hosts", W=4, E=8, K=3, H=64, bs=6, hier="host", arn=True,
       comm_quant=2, seed=4243),
    _c("hosts_hierarchy_groups_are_hosts_comm_quant4", W=4, E=8, K=2, H=192, bs=5, hier="host",
       comm_quant=4, edge=True),
]

# (hosts, ranks) -> the cases of that job
JOBS = {(2, 2): CASES[2], (2, 4): CASES[4] + HOST_CASES}
_results = {}


def _run(hosts, world, tmp_dir):
    key = (hosts, world)
    if key in _results:
        return _results[key]
    cases = os.path.join(tmp_dir, f"hosts{hosts}_cases{world}.json")
    with open(cases, "w") as f:
        json.dump(JOBS[key], f)
    prefix = os.path.join(tmp_dir, f"hosts{hosts}_out{world}")
    env = {"PYTHONPATH": os.path.join(HERE, "..", "..", "python"),
           "HYPER_PARALLEL_SHMEM_HEAP_SIZE": "256M", "HYPER_PARALLEL_SHMEM_TIMEOUT_SEC": "60"}
    r = Launch(["--hosts", str(hosts), "-n", str(world), "--timeout", "240", "--json", "--", PY,
                os.path.join(HERE, "v2_worker.py"), cases, prefix], env, timeout=270)
    per_rank = []
    for rank in range(world):
        path = f"{prefix}.{rank}.json"
        per_rank.append(json.load(open(path)) if os.path.exists(path) else None)
    _results[key] = (r, per_rank)
    return _results[key]


@needs_root
@pytest.mark.parametrize("hosts,world,name",
                         [(h, w, c["name"]) for (h, w), cases in sorted(JOBS.items())
                          for c in cases])
def test_case_across_hosts(hosts, world, name, tmp_path_factory):
    r, per_rank = _run(hosts, world, str(tmp_path_factory.getbasetemp()))
    for rank, res in enumerate(per_rank):
        assert res is not None, f"rank {rank} wrote no results:\n{r.out[-4000:]}\n{r.err[-4000:]}"
        assert name in res, f"rank {rank} did not run {name}"
        assert res[name] == "ok", f"rank {rank} (host {rank * hosts // world}):\n{res[name]}"


@needs_root
@pytest.mark.parametrize("hosts,world", sorted(JOBS))
def test_job_ran_on_separate_hosts_and_left_nothing(hosts, world, tmp_path_factory):
    r, _ = _run(hosts, world, str(tmp_path_factory.getbasetemp()))
    assert r.rc == 0, r.err[-4000:]
    summary = r.json()
    by_host = {}
    for p in summary["procs"]:
        by_host.setdefault(p["host"], set()).add(p["hostname"])
        assert p["exit_status"] == 0, p
    assert sorted(by_host) == list(range(hosts)) and all(len(v) == 1 for v in by_host.values())
    assert len(set.union(*by_host.values())) == hosts
    assert summary["shm_leftovers"] == [] and summary["cleanup_ok"], summary
    assert_nothing_left(r.pid)


# ---- EP subgroups (the operators' scope is the EP group) ----------------------------------------

@needs_root
def test_ep_subgroups_run_independently(tmp_path):
    """4 ranks = 2 replicas x EP 2 at 2 hosts x 2 ranks, groups on one host each (block) and
    spanning both (strided), running different case lists (v2_subgroup_worker.py), every
    output bit for bit against the numpy model: each group's records, pools and call order
    belong to its own team, so the other group never takes part."""
    prefix = str(tmp_path / "sub")
    env = {"PYTHONPATH": os.path.join(HERE, "..", "..", "python"),
           "HYPER_PARALLEL_SHMEM_HEAP_SIZE": "256M", "HYPER_PARALLEL_SHMEM_TIMEOUT_SEC": "10"}
    r = Launch(["--hosts", "2", "-n", "4", "--timeout", "120", "--", PY,
                os.path.join(HERE, "v2_subgroup_worker.py"), prefix], env, timeout=150)
    for rank in range(4):
        path = f"{prefix}.{rank}.json"
        assert os.path.exists(path), f"rank {rank} wrote no results:\n{r.err[-3000:]}"
        res = json.load(open(path))
        bad = {k: v for k, v in res.items() if v != "ok"}
        assert not bad, f"rank {rank}: {bad}"
        # block: ranks 0,1 run replica 0's 4 cases, 2,3 replica 1's 2; strided: 0,2 / 1,3
        assert len(res) == (4 if rank < 2 else 2) + (4 if rank % 2 == 0 else 2), res
    assert r.rc == 0, r.err[-3000:]
    assert_nothing_left(r.pid)
