"""torch_npu's V1 operators through megamoe.ops, called exactly as vllm-ascend (A3 and A2
paths), sglang's Ascend dispatcher and omni-infer call them, on 2 and 4 ranks: outputs bit-exact
to the numpy model and to the V2 operators (v1_worker.py). One launch per world size."""
import json
import os
import sys

import pytest

from conftest import run_megamoe

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from v1_cases import CASES  # noqa: E402

_results = {}
_NAMES = [(w, c["name"]) for w in sorted(CASES) for c in CASES[w]] + \
         [(w, "mixed_expand_idx_paths") for w in sorted(CASES)]


def _run(world, tmp_dir):
    if world not in _results:
        prefix = os.path.join(tmp_dir, f"v1_{world}")
        env = {"PYTHONPATH": os.path.join(HERE, "..", "..", "python"),
               "HYPER_PARALLEL_SHMEM_HEAP_SIZE": "64M", "MEGAMOE_LOG_LEVEL": "off"}
        r = run_megamoe(["launch", "-n", str(world), "--timeout", "200", "--", sys.executable,
                         os.path.join(HERE, "v1_worker.py"), prefix], env_extra=env, timeout=230)
        per_rank = []
        for rank in range(world):
            path = f"{prefix}.{rank}.json"
            per_rank.append(json.load(open(path)) if os.path.exists(path) else None)
        _results[world] = (r, per_rank)
    return _results[world]


@pytest.mark.parametrize("world,name", _NAMES, ids=[f"{w}-{n}" for w, n in _NAMES])
def test_v1_case(world, name, tmp_path_factory, megamoe_bin):
    r, per_rank = _run(world, str(tmp_path_factory.getbasetemp()))
    for rank, res in enumerate(per_rank):
        assert res is not None, f"rank {rank} wrote no results:\n{r.stdout[-4000:]}\n{r.stderr[-4000:]}"
        assert name in res, f"rank {rank} did not run {name}"
        assert res[name] == "ok", f"rank {rank}:\n{res[name]}"
