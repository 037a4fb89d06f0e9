"""MegaMoeExperts with per-call token counts from PyTorch (torchrun, gloo; EP 2 and 4): counts
0, 1, 127..129, T_cap and random per rank and call through autograd against the reference
(O0, O1, push; an optimizer step between calls), bit identity with a fixed layer when every
rank passes T, empty ranks and all-empty calls, no_grad, expert_weights=, shared layers with
outstanding forwards, and every error rule (experts_dyn_worker.py runs them in one job)."""
import os

import pytest

from test_experts_torch import torchrun

HERE = os.path.dirname(os.path.abspath(__file__))


@pytest.mark.parametrize("ep", [2, 4])
def test_per_call_token_counts(ep):
    r = torchrun(ep, os.path.join(HERE, "experts_dyn_worker.py"), timeout=400)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-6000:]
    for case in ("counts", "identity", "empty", "shared", "errors"):
        assert f"rank 0 ep {ep} case {case}: ok" in out, out[-6000:]
