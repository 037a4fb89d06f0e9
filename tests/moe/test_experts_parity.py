"""MegaMoeExperts parity with HyperParallel's current module (issue 13): the two capacity
spellings and their errors, dispatch_mode push/pull through autograd, tokens_per_expert's shape
rule, per-call expert_weights, and the SHMEM lifecycle ending with the last close — under
torchrun with 2 ranks."""
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_experts_torch import HERE, _free_port, torchrun  # noqa: E402

WORKER = os.path.join(HERE, "experts_parity_worker.py")


@pytest.mark.parametrize("cases", [("constructor", "tokens_per_expert", "modes", "expert_weights"),
                                   ("lifecycle",)])
def test_parity_cases(cases, monkeypatch):
    # the lifecycle case runs alone: it starts and ends SHMEM lifecycles of its process
    monkeypatch.setenv("MM_TEST_ENDPOINT2", f"tcp://127.0.0.1:{_free_port()}")
    monkeypatch.delenv("HYPER_PARALLEL_SHMEM_HEAP_SIZE", raising=False)
    r = torchrun(2, WORKER, *cases)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-6000:]
    for case in cases:
        assert f"rank 0 ep 2 case {case}: ok" in out, out[-6000:]
