"""mega_moe with ranks on simulated hosts (`megamoe launch --hosts 2`): every case of
serve_cases.py (each scene, masks, zero-token ranks, the rank mask, shared experts, EP
subgroups spanning both hosts, combine quantisation) and the rules at 2 hosts x 1 rank and
2 hosts x 2 ranks, rows moving through the inter-host engine (UCX puts and gets). Run by CTest
(labels serve, hosts); needs root and skips without."""
import json
import os
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "tools"))
from hosts_util import PY, Launch, assert_nothing_left, needs_python_library, needs_root  # noqa: E402
from serve_cases import CASES, RULES  # noqa: E402

pytestmark = needs_python_library
JOBS = [(2, 2), (2, 4)]
_results = {}


def _run(hosts, world, tmp_dir):
    key = (hosts, world)
    if key not in _results:
        prefix = os.path.join(tmp_dir, f"serve_hosts{hosts}_{world}")
        env = {"PYTHONPATH": os.path.join(HERE, "..", "..", "python"),
               "HYPER_PARALLEL_SHMEM_HEAP_SIZE": "256M", "HYPER_PARALLEL_SHMEM_TIMEOUT_SEC": "60",
               "MEGAMOE_LOG_LEVEL": "off", "MEGAMOE_THREADS": "1"}
        r = Launch(["--hosts", str(hosts), "-n", str(world), "--timeout", "400", "--json", "--",
                    PY, os.path.join(HERE, "serve_worker.py"), prefix, "all"], env, timeout=430)
        per_rank = []
        for rank in range(world):
            path = f"{prefix}.{rank}.json"
            per_rank.append(json.load(open(path)) if os.path.exists(path) else None)
        _results[key] = (r, per_rank)
    return _results[key]


@needs_root
@pytest.mark.parametrize("hosts,world,name",
                         [(h, w, c["name"]) for h, w in JOBS for c in CASES if w in c["worlds"]]
                         + [(h, w, "rule:" + r["name"]) for h, w in JOBS for r in RULES])
def test_across_hosts(hosts, world, name, tmp_path_factory):
    r, per_rank = _run(hosts, world, str(tmp_path_factory.getbasetemp()))
    for rank, res in enumerate(per_rank):
        assert res is not None, f"rank {rank} wrote no results:\n{r.out[-4000:]}\n{r.err[-4000:]}"
        got = res.get(name)
        assert got is not None, f"rank {rank} did not run {name}"
        if name.startswith("rule:"):
            assert got["error"] is not None and got["after"] == "ok", f"rank {rank}: {got}"
        else:
            assert got.get("ok"), f"rank {rank} (host {rank * hosts // world}): {got.get('problems')}"


@needs_root
@pytest.mark.parametrize("hosts,world", JOBS)
def test_job_ran_on_separate_hosts_and_left_nothing(hosts, world, tmp_path_factory):
    r, _ = _run(hosts, world, str(tmp_path_factory.getbasetemp()))
    assert r.rc == 0, r.err[-4000:]
    summary = r.json()
    hosts_seen = {p["host"] for p in summary["procs"]}
    assert sorted(hosts_seen) == list(range(hosts))
    assert all(p["exit_status"] == 0 for p in summary["procs"])
    assert summary["shm_leftovers"] == [] and summary["cleanup_ok"], summary
    assert_nothing_left(r.pid)


@needs_root
@pytest.mark.parametrize("hosts,world", JOBS)
def test_o1_and_host_paths_same_bits_across_hosts(hosts, world, tmp_path_factory):
    """Across hosts the O1 path puts the results back into their sources' return rows (the
    host path gets them), also with a source's receive rows at the capacity (bf16_rank0_full):
    y and expert_token_nums bit for bit with the host path, and auto took the O1 path."""
    _, per_rank = _run(hosts, world, str(tmp_path_factory.getbasetemp()))
    for rank, res in enumerate(per_rank):
        assert res is not None, f"rank {rank} wrote no results"
        paths = res["paths"]
        assert "crash" not in paths, paths.get("crash")
        assert "bf16_rank0_full" in paths
        for name, got in paths.items():
            assert got["same"], f"rank {rank} {name}: the paths differ"
            assert got["o1"] == 1 and got["host_o1"] == 0, f"rank {rank} {name}: {got}"
