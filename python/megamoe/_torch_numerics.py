"""How exact torch's bf16 matmul is on this CPU (for tests and benches that compare with it).

torch 1.13 on a CPU without AVX-512 (Zen 2/3, Haswell on: no oneDNN bf16 path) computes a bf16
matmul with bf16 accumulation: its relative error grows like sqrt(K), about 1.3 % at K = 128,
1.9 % at 256 and 7 % at 4096. With AVX-512 it accumulates in fp32 and returns the fp32 product
rounded to bf16, as megamoe's kernels do. A bound derived for that case (the 1 % rule of
bench/moe_verify.h) does not hold for a torch bf16 path where torch is inexact, so the sites
that hold megamoe to such a path ask here which case they are in (docs/torch.md).
"""
import functools

import torch

__all__ = ["bf16_matmul_error", "torch_bf16_accumulates_in_bf16", "matmul_fp32_acc",
           "INEXACT_ABOVE", "PROBE_K"]

PROBE_K = 256          # the fixed probe: [64, K] @ [K, 128], seed 0
INEXACT_ABOVE = 1e-3   # an fp32-accumulating matmul differs from the rounded product by ~0


@functools.lru_cache(maxsize=None)
def bf16_matmul_error(k=PROBE_K):
    """Relative L2 error of torch's bf16 matmul [64, k] @ [k, 128] (random normal bf16 inputs,
    fixed seed) against the fp32-accumulated product of the same inputs rounded to bf16, i.e.
    against what an fp32-accumulating bf16 matmul returns: ~0 (ties in the summation order
    only) where torch accumulates in fp32, ~1.2e-3 * sqrt(k) where it accumulates in bf16.
    Measured once per process and k (a few ms)."""
    g = torch.Generator().manual_seed(0)
    a = torch.randn(64, k, generator=g).bfloat16()
    b = torch.randn(k, 128, generator=g).bfloat16()
    want = a.float() @ b.float()
    got = (a @ b).float()
    return float((got - want.bfloat16().float()).norm() / want.norm())


def torch_bf16_accumulates_in_bf16():
    """True where torch's bf16 matmul accumulates in bf16 here (the fixed probe's error above
    INEXACT_ABOVE): bounds derived for fp32 accumulation do not hold for torch's bf16 path."""
    return bf16_matmul_error() > INEXACT_ABOVE


def matmul_fp32_acc(a, b):
    """a @ b of bf16 tensors as an fp32-accumulating bf16 matmul computes it (torch's result
    with AVX-512): the fp32 product rounded to bf16; a drop-in for torch.matmul in the
    reference forms of a torch bf16 path."""
    return (a.float() @ b.float()).to(a.dtype)
