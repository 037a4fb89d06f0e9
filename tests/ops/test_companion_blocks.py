"""The multi-rank companion tests (companion_worker.py) on 2 and 4 ranks, one launch per world
size: DispatchV2 with a pre-quantised x and with comm_alg "fullmesh" (A2), and each real
caller's whole MoE block (spec §14) against a float64 model."""
import json
import os
import sys

import pytest

from conftest import run_megamoe

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from companion_worker import CASES  # noqa: E402

_results = {}
_NAMES = [(w, n) for w in (2, 4) for n in CASES]


def _run(world, tmp_dir):
    if world not in _results:
        prefix = os.path.join(tmp_dir, f"companion_{world}")
        env = {"PYTHONPATH": os.path.join(HERE, "..", "..", "python"),
               "HYPER_PARALLEL_SHMEM_HEAP_SIZE": "128M", "MEGAMOE_LOG_LEVEL": "off",
               "OMP_NUM_THREADS": "1"}
        r = run_megamoe(["launch", "-n", str(world), "--timeout", "400", "--", sys.executable,
                         os.path.join(HERE, "companion_worker.py"), prefix], env_extra=env,
                        timeout=430)
        per_rank = []
        for rank in range(world):
            path = f"{prefix}.{rank}.json"
            per_rank.append(json.load(open(path)) if os.path.exists(path) else None)
        _results[world] = (r, per_rank)
    return _results[world]


@pytest.mark.parametrize("world,name", _NAMES, ids=[f"{w}-{n}" for w, n in _NAMES])
def test_companion_case(world, name, tmp_path_factory, megamoe_bin):
    r, per_rank = _run(world, str(tmp_path_factory.getbasetemp()))
    for rank, res in enumerate(per_rank):
        assert res is not None, f"rank {rank} wrote no results:\n{r.stdout[-4000:]}\n{r.stderr[-4000:]}"
        assert name in res, f"rank {rank} did not run {name}"
        assert res[name] == "ok", f"rank {rank}:\n{res[name]}"
