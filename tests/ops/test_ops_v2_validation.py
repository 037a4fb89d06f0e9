"""Every validation rule of the v2 operators (v2_rules.py): the error reaches every rank before
any data moves (INVALID_ARGUMENT naming the parameter and the rule on the ranks that detected
it, the same status with "rank R:" on the others; CONFIG_MISMATCH everywhere for attributes
that differ, CALL_MISMATCH for operators called in a different order), and the next call
works. One launch per world size runs all the rules."""
import json
import os
import sys

import pytest

from conftest import run_megamoe

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from v2_rules import RULES  # noqa: E402

_results = {}


def _run(world, tmp_dir):
    if world not in _results:
        prefix = os.path.join(tmp_dir, f"rules{world}")
        env = {"PYTHONPATH": os.path.join(HERE, "..", "..", "python"),
               "HYPER_PARALLEL_SHMEM_HEAP_SIZE": "64M", "MEGAMOE_LOG_LEVEL": "off"}
        r = run_megamoe(["launch", "-n", str(world), "--timeout", "240", "--", sys.executable,
                         os.path.join(HERE, "v2_rules_worker.py"), str(world), prefix],
                        env_extra=env, timeout=270)
        per_rank = []
        for rank in range(world):
            path = f"{prefix}.{rank}.json"
            per_rank.append(json.load(open(path)) if os.path.exists(path) else None)
        _results[world] = (r, per_rank)
    return _results[world]


@pytest.mark.parametrize("rule", RULES, ids=[r["name"] for r in RULES])
def test_rule(rule, tmp_path_factory, megamoe_bin):
    r, per_rank = _run(rule["world"], str(tmp_path_factory.getbasetemp()))
    for rank, res in enumerate(per_rank):
        assert res is not None, f"rank {rank} wrote no results:\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
        got = res.get(rule["name"])
        assert got is not None, f"rank {rank} did not run the rule"
        assert got["status"] == rule["status"], f"rank {rank}: {got}"
        assert rule["key"] in got["message"], f"rank {rank}: {got['message']!r} lacks {rule['key']!r}"
        detected = rule["on"] == "all" or rule["on"] == rank or rule["status"] in ("CONFIG_MISMATCH",
                                                                           "CALL_MISMATCH")
        if not detected:
            assert f"rank " in got["message"], f"rank {rank}: {got['message']!r}"
        assert got["after"] == "ok", f"rank {rank}: the next call failed: {got['after']}"
