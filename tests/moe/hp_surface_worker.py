"""One rank of test_experts_hp_surface.py (2 ranks under `megamoe launch`): HyperParallel's
newest MegaMoeExperts surface.

* checkpoint: the layer under non-reentrant activation checkpointing
  (torch.utils.checkpoint.checkpoint(..., use_reentrant=False)) gives the same output and
  gradients, bit for bit, as without it; the checkpointed forward keeps no saved state (the
  backward recomputes it), and nothing is left after the backward.
* replica_transport: every upstream mode is accepted (one transport on a CPU: identical
  output and gradients), anything else is refused.
"""
import os
import sys

import torch
from torch.utils.checkpoint import checkpoint

import megamoe.experts as mex
from megamoe import _experts_ops
from megamoe import MegaMoeExperts

RANK = int(os.environ["RANK"])
WORLD = int(os.environ["WORLD_SIZE"])
T, H, I, E, K = 128, 64, 32, 4, 2


def inputs(seed):
    g = torch.Generator().manual_seed(seed + RANK)
    x = torch.randn(T, H, generator=g).bfloat16()
    ids = torch.stack([torch.randperm(E, generator=g)[:K] for _ in range(T)])
    if seed % 2:  # every token to rank 0's experts: they get replicas on rank 1
        ids[:, 0] = 0
        ids[:, 1] = 1
    w = torch.rand(T, K, generator=g)
    return x, ids, w


def live_states():
    """Forward saved states the library still holds (megamoe/_experts_ops.py)."""
    return sum(1 for ref in _experts_ops._saved_states.values()
               if ref() is not None and ref().handle)


def run(layer, x, ids, w, ckpt):
    xg = x.clone().requires_grad_()
    wg = w.clone().requires_grad_()
    for p in layer.parameters():
        p.grad = None

    def block(a, b):
        return layer(a * 1.0, ids, b).float().tanh()  # something around the layer, as a model

    out = checkpoint(block, xg, wg, use_reentrant=False) if ckpt else block(xg, wg)
    live_after_forward = live_states()
    out.square().sum().backward()
    return (out.detach(), xg.grad, wg.grad, layer.gate_up_weight.grad.clone(),
            layer.down_weight.grad.clone(), live_after_forward)


def case_checkpoint():
    torch.manual_seed(0)
    layer = MegaMoeExperts(T, H, I, E, K, ep_size=WORLD).to(torch.bfloat16)
    x, ids, w = inputs(10)
    plain = run(layer, x, ids, w, False)
    assert plain[5] == 1, "a plain forward keeps its saved state for the backward"
    ck = run(layer, x, ids, w, True)
    assert ck[5] == 0, f"the checkpointed forward kept {ck[5]} saved state(s)"
    for name, a, b in zip(("out", "d x", "d w", "d gate_up", "d down"), plain, ck):
        assert torch.equal(a, b), f"{name} differs under checkpointing"
    assert live_states() == 0, "saved states left after the backward"
    layer.close()


def case_replica_transport():
    results = []
    for mode in mex.REPLICA_TRANSPORTS:
        torch.manual_seed(0)
        layer = MegaMoeExperts(T, H, I, E, K, ep_size=WORLD, replica_slots_per_rank=1,
                               replica_transport=mode).to(torch.bfloat16)
        assert layer.replica_transport == mode and f"replica_transport={mode!r}" in repr(layer)
        x, ids, w = inputs(11)
        results.append(run(layer, x, ids, w, False))
        assert layer.info()["replicas"], "skewed routing made no replica"
        layer.close()
    for r in results[1:]:
        for a, b in zip(results[0][:5], r[:5]):
            assert torch.equal(a, b), "replica transports differ"
    try:
        MegaMoeExperts(T, H, I, E, K, ep_size=WORLD, replica_transport="rdma")
    except ValueError as exc:
        assert "replica_transport" in str(exc), exc
    else:
        raise AssertionError("replica_transport='rdma' was accepted")


if __name__ == "__main__":
    for name in sys.argv[1:]:
        globals()[f"case_{name}"]()
        print(f"rank {RANK} case {name}: ok", flush=True)
