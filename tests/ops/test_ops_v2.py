"""DispatchV2 / CombineV2 / CombineAddRmsNorm through megamoe.ops on 2, 3 and 4 ranks, every output
compared bit for bit with the independent numpy model of the spec (v2_ref.py).

Each world size runs all of its cases (v2_cases.py) in ONE `megamoe launch`, so the suite stays
fast; every case is still reported as its own test.
"""
import json
import os
import sys

import pytest

from conftest import run_megamoe

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from v2_cases import CASES  # noqa: E402

_results = {}


def _run(world, tmp_dir):
    if world in _results:
        return _results[world]
    cases = os.path.join(tmp_dir, f"cases{world}.json")
    with open(cases, "w") as f:
        json.dump(CASES[world], f)
    prefix = os.path.join(tmp_dir, f"out{world}")
    env = {"PYTHONPATH": os.path.join(HERE, "..", "..", "python"),
           "HYPER_PARALLEL_SHMEM_HEAP_SIZE": "256M"}
    r = run_megamoe(["launch", "-n", str(world), "--timeout", "300", "--", sys.executable,
                     os.path.join(HERE, "v2_worker.py"), cases, prefix], env_extra=env, timeout=330)
    per_rank = []
    for rank in range(world):
        path = f"{prefix}.{rank}.json"
        if not os.path.exists(path):
            per_rank.append(None)
            continue
        with open(path) as f:
            per_rank.append(json.load(f))
    _results[world] = (r, per_rank)
    return _results[world]


@pytest.mark.parametrize("world,name", [(w, c["name"]) for w in sorted(CASES) for c in CASES[w]])
def test_case(world, name, tmp_path_factory, megamoe_bin):
    r, per_rank = _run(world, str(tmp_path_factory.getbasetemp()))
    for rank, res in enumerate(per_rank):
        assert res is not None, f"rank {rank} wrote no results:\n{r.stdout[-4000:]}\n{r.stderr[-4000:]}"
        assert name in res, f"rank {rank} did not run {name}"
        assert res[name] == "ok", f"rank {rank}:\n{res[name]}"
