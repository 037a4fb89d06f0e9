"""SwiGLU forward and backward against torch autograd in fp32 (silu, clamp), with and without
swiglu_limit (values at, inside and beyond the bounds), odd widths, padded strides, on the
library's AVX-512 and scalar paths."""
import numpy as np
import pytest
import torch

from _kernels_lib import bf16_bits_to_f32, lib, ok, ptr, vector_mode


def to_bf16_np(t):
    return t.to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16).copy()


def from_bf16_np(a):
    return torch.from_numpy(bf16_bits_to_f32(a).copy())


def torch_swiglu(h, da, limit):
    hf = h.clone().requires_grad_(True)
    inter = h.shape[1] // 2
    g, u = hf[:, :inter], hf[:, inter:]
    if limit is not None and limit > 0:
        g = g.clamp(max=limit)
        u = u.clamp(min=-limit, max=limit)
    a = torch.nn.functional.silu(g) * u
    a.backward(da)
    return a.detach(), hf.grad


@pytest.mark.parametrize("vector", [True, False], ids=["avx512", "scalar"])
@pytest.mark.parametrize("inter", [1, 17, 128, 300])
@pytest.mark.parametrize("limit", [None, 7.0, 1.0])
def test_matches_torch_autograd(vector, inter, limit):
    torch.manual_seed(inter)
    rows, pad = 37, 3
    h = (torch.randn(rows, 2 * inter) * 4).to(torch.bfloat16).float()
    if limit:
        # values exactly at the bounds, and beyond them
        h[0, :inter] = limit
        h[1, inter:] = limit
        h[2, inter:] = -limit
        h[3] = 3 * limit
        h[4] = -3 * limit
    da = torch.randn(rows, inter).to(torch.bfloat16).float()
    hb = np.zeros((rows, 2 * inter + pad), np.uint16)
    hb[:, :2 * inter] = to_bf16_np(h)
    dab = np.zeros((rows, inter + pad), np.uint16)
    dab[:, :inter] = to_bf16_np(da)
    a = np.zeros((rows, inter + pad), np.uint16)
    dh = np.zeros((rows, 2 * inter + pad), np.uint16)
    lim = float(limit or 0.0)
    with vector_mode(vector):
        ok(lib.mm_swiglu_fwd(rows, inter, ptr(hb), 2 * inter + pad, ptr(a), inter + pad, lim))
        ok(lib.mm_swiglu_bwd(rows, inter, ptr(hb), 2 * inter + pad, ptr(dab), inter + pad, ptr(dh),
                             2 * inter + pad, lim))
    want_a, want_dh = torch_swiglu(h, da, limit)
    got_a = from_bf16_np(a[:, :inter])
    got_dh = from_bf16_np(dh[:, :2 * inter])
    # one bf16 rounding of an fp32 result (relative 2^-9), plus fp32 noise near zeros of silu'
    torch.testing.assert_close(got_a, want_a, rtol=2.0 ** -8, atol=1e-6)
    torch.testing.assert_close(got_dh, want_dh, rtol=2.0 ** -8, atol=1e-4 * float(want_dh.abs().max()) + 1e-6)
    if limit:
        # the clamp's zero gradient is exact, and the gradient passes at the bounds
        gate, up = h[:, :inter], h[:, inter:]
        assert torch.all(got_dh[:, :inter][gate > limit] == 0)
        assert torch.all(got_dh[:, inter:][up.abs() > limit] == 0)
        assert torch.equal(got_dh[:, :inter][gate > limit] == 0, want_dh[:, :inter][gate > limit] == 0)
        at = (gate == limit) & (da != 0)
        assert torch.all(got_dh[:, :inter][at] != 0)
    assert np.all(a[:, inter:] == 0) and np.all(dh[:, 2 * inter:] == 0), "padding written"
