"""bf16 / fp16 conversions agree bit for bit with torch 1.13 on a million random fp32 values."""
import numpy as np
import torch

from megamoe import _lib

BF16, FP16, FP32 = 1, 2, 0


def _convert(values, dst_type):
    src = np.ascontiguousarray(values, dtype=np.float32)
    out = np.empty(src.shape, dtype=np.uint16)
    st = _lib.lib.megamoe_convert(out.ctypes.data, dst_type, src.ctypes.data, FP32, src.size)
    assert st == 0
    return out


def _random_fp32(n, seed):
    rng = np.random.default_rng(seed)
    # Mix of scales: normal-ish values, wide exponents, and values near the fp16 range edges.
    a = rng.standard_normal(n // 4).astype(np.float32)
    b = (rng.standard_normal(n // 4) * np.exp2(rng.integers(-30, 30, n // 4))).astype(np.float32)
    c = rng.uniform(-70000, 70000, n // 4).astype(np.float32)
    bits = rng.integers(0, 2**32, n - 3 * (n // 4), dtype=np.uint64).astype(np.uint32)
    d = bits.view(np.float32)
    d = d[np.isfinite(d)]
    return np.concatenate([a, b, c, d])


def test_bf16_matches_torch():
    x = _random_fp32(1_000_000, 1)
    ours = _convert(x, BF16)
    theirs = torch.from_numpy(x).to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)
    mismatch = np.nonzero(ours != theirs)[0]
    assert mismatch.size == 0, f"{mismatch.size} mismatches, first x={x[mismatch[0]]!r}"


def test_fp16_matches_torch():
    x = _random_fp32(1_000_000, 2)
    ours = _convert(x, FP16)
    theirs = torch.from_numpy(x).to(torch.float16).numpy().view(np.uint16)
    mismatch = np.nonzero(ours != theirs)[0]
    assert mismatch.size == 0, f"{mismatch.size} mismatches, first x={x[mismatch[0]]!r}"
