"""The C reference model against torch autograd: forward and every gradient.

Two comparisons per case:
* against torch in fp32 (what the issue asks): elementwise |ours - torch| <= 1e-5 |torch| + atol
  with atol = 1e-6 * max|torch| of that tensor, and the norm-wise relative error <= 1e-5. The
  atol is needed because torch's fp32 sums carry an error of a few ulp of the largest *terms*,
  which is large relative to an element that nearly cancels; 1e-6 of the tensor's largest value
  is about 8 fp32 ulp of it, far below what any wrong term would produce.
* against torch in fp64 on the same (fp32) inputs: the reference accumulates in fp64 and rounds
  once, so it must be within one fp32 ulp of the exact result (rtol 2^-23) everywhere.
"""
import pytest
import torch
import torch.nn.functional as F

from megamoe import MegaMoeError
from megamoe import reference

ULP = 2.0 ** -23


def torch_moe(x, ids, w, gate_up, down, limit):
    inter = down.shape[1]
    ids = ids.long()
    h = torch.einsum("nh,nkhj->nkj", x, gate_up[ids])
    g, u = h[..., :inter], h[..., inter:]
    if limit is not None:
        g = g.clamp(max=limit)
        u = u.clamp(-limit, limit)
    a = F.silu(g) * u
    y = torch.einsum("nki,nkih->nkh", a, down[ids])
    return (w.unsqueeze(-1) * y).sum(1), h


def torch_grads(x, ids, w, gate_up, down, dout, limit, dtype):
    if limit is not None:  # the C API takes the limit as a float: compare with that value
        limit = torch.tensor(limit, dtype=torch.float32).item()
    leaves = [t.detach().to(dtype).requires_grad_() for t in (x, w, gate_up, down)]
    out, h = torch_moe(leaves[0], ids, leaves[1], leaves[2], leaves[3], limit)
    out.backward(dout.to(dtype))
    return out.detach(), [t.grad for t in leaves], h.detach()


def make_case(ep, t, hidden, inter, experts, k, skip, ids_dtype, seed):
    gen = torch.Generator().manual_seed(seed)
    n = ep * t
    x = torch.randn(n, hidden, generator=gen)
    w = torch.rand(n, k, generator=gen)
    gate_up = torch.randn(experts, hidden, 2 * inter, generator=gen) / hidden ** 0.5
    down = torch.randn(experts, inter, hidden, generator=gen) / inter ** 0.5
    dout = torch.randn(n, hidden, generator=gen)
    allowed = torch.tensor([e for e in range(experts) if e not in skip])
    ids = torch.stack([allowed[torch.randperm(len(allowed), generator=gen)[:k]]
                       for _ in range(n)]).to(ids_dtype)
    return x, ids, w, gate_up, down, dout


def assert_close_fp32(name, got, want):
    atol = 1e-6 * want.abs().max().item()
    err = (got - want).abs()
    bad = err > 1e-5 * want.abs() + atol
    assert not bad.any(), (f"{name}: {int(bad.sum())} elements off, worst {err.max().item():.3g} "
                           f"(atol {atol:.3g})")
    norm = (got - want).norm() / want.norm().clamp_min(1e-30)
    assert norm <= 1e-5, f"{name}: relative norm error {norm.item():.3g}"


def assert_within_ulp(name, got, exact):
    err = (got.double() - exact).abs()
    tol = ULP * exact.abs() + 1e-10 * exact.abs().max().item()
    bad = err > tol
    assert not bad.any(), f"{name}: {int(bad.sum())} elements more than 1 ulp from fp64 torch"


#        ep  T   H   I   E  K  experts without tokens
CASES = [(1, 6, 8, 4, 2, 1, ()),
         (2, 5, 16, 8, 4, 2, (1,)),
         (2, 8, 24, 12, 6, 3, ()),
         (4, 3, 32, 16, 8, 3, (0, 5, 7)),
         (4, 4, 12, 8, 4, 1, (2, 3))]


@pytest.mark.parametrize("limit", [None, 0.8])
@pytest.mark.parametrize("case", range(len(CASES)))
def test_matches_torch_autograd(case, limit):
    ep, t, hidden, inter, experts, k, skip = CASES[case]
    ids_dtype = torch.int32 if case % 2 else torch.int64
    x, ids, w, gate_up, down, dout = make_case(ep, t, hidden, inter, experts, k, skip,
                                               ids_dtype, seed=100 + case)

    out = reference.forward(x, ids, w, gate_up, down, ep=ep, swiglu_limit=limit)
    grads = reference.backward(dout, x, ids, w, gate_up, down, ep=ep, swiglu_limit=limit)
    assert out.dtype == torch.float32 and out.shape == x.shape
    ours = [out, grads.hidden, grads.topk_weights, grads.gate_up, grads.down]
    names = ["out", "grad_hidden", "grad_topk_weights", "grad_gate_up", "grad_down"]

    out32, g32, h = torch_grads(x, ids, w, gate_up, down, dout, limit, torch.float32)
    out64, g64, _ = torch_grads(x, ids, w, gate_up, down, dout, limit, torch.float64)
    for name, got, want, exact in zip(names, ours, [out32] + g32, [out64] + g64):
        assert got.shape == want.shape, name
        assert_close_fp32(name, got, want)
        assert_within_ulp(name, got, exact)

    if limit is not None:  # the clamp must really bite for this to test it
        clamped = ((h[..., :inter] > limit).float().mean() + (h[..., inter:].abs() > limit)
                   .float().mean()) / 2
        assert 0.1 < clamped < 0.9, f"clamped fraction {clamped:.2f}"
    for e in range(experts):
        used = bool((ids == e).any())
        for name, g in (("grad_gate_up", grads.gate_up[e]), ("grad_down", grads.down[e])):
            if used:
                assert g.abs().max() > 0, f"{name}[{e}] is zero for a used expert"
            else:
                assert torch.count_nonzero(g) == 0, f"{name}[{e}]: expert without tokens"


def bf(v):
    """A bf16-stored intermediate: rounded to bf16 via fp32, as the C reference rounds."""
    return v.float().bfloat16().double()


def torch_bf16_intermediates(x, ids, w, gate_up, down, dout, limit):
    """An independent fp64 forward and hand-written backward that rounds to bf16 where a bf16
    implementation stores tensors (include/megamoe/reference.h, bf16_intermediates)."""
    x, w, gu, dn, dout = (t.double() for t in (x, w, gate_up, down, dout))
    inter, ids = dn.shape[1], ids.long()
    w1, w2 = gu[ids], dn[ids]  # [n, k, H, 2I], [n, k, I, H]
    h = bf(torch.einsum("nh,nkhj->nkj", x, w1))
    g, u = h[..., :inter], h[..., inter:]
    gpass, upass = torch.ones_like(g), torch.ones_like(u)
    if limit is not None:
        lim = torch.tensor(limit, dtype=torch.float32).item()
        gpass, upass = (g <= lim).double(), ((u >= -lim) & (u <= lim)).double()
        g, u = g.clamp(max=lim), u.clamp(-lim, lim)
    s = torch.sigmoid(g)
    a = bf(g * s * u)
    y = bf(torch.einsum("nki,nkih->nkh", a, w2))
    out = (w.unsqueeze(-1) * y).sum(1)
    d_w = torch.einsum("nh,nkh->nk", dout, y)
    dy = bf(w.unsqueeze(-1) * dout.unsqueeze(1))
    da = bf(torch.einsum("nkh,nkih->nki", dy, w2))
    dh = torch.cat([bf(da * u * s * (1 + g * (1 - s))) * gpass, bf(da * g * s) * upass], -1)
    d_x = bf(torch.einsum("nkj,nkhj->nkh", dh, w1)).sum(1)
    d_gu, d_dn = torch.zeros_like(gu), torch.zeros_like(dn)
    flat = ids.flatten()
    d_gu.index_add_(0, flat, torch.einsum("nh,nkj->nkhj", x, dh).flatten(0, 1))
    d_dn.index_add_(0, flat, torch.einsum("nki,nkh->nkih", a, dy).flatten(0, 1))
    return out, [d_x, d_w, d_gu, d_dn]


@pytest.mark.parametrize("limit", [None, 0.8])
@pytest.mark.parametrize("case", [0, 3])
def test_bf16_intermediates_match_an_independent_model(case, limit):
    ep, t, hidden, inter, experts, k, skip = CASES[case]
    x, ids, w, gate_up, down, dout = make_case(ep, t, hidden, inter, experts, k, skip,
                                               torch.int32, seed=200 + case)
    b = [v.bfloat16() for v in (x, w, gate_up, down, dout)]
    out = reference.forward(b[0], ids, b[1], b[2], b[3], ep=ep, swiglu_limit=limit,
                            bf16_intermediates=True)
    grads = reference.backward(b[4], b[0], ids, b[1], b[2], b[3], ep=ep, swiglu_limit=limit,
                               bf16_intermediates=True)
    want_out, want_grads = torch_bf16_intermediates(*[v.float() for v in b[:1]], ids,
                                                    *[v.float() for v in b[1:]], limit)
    exact = reference.forward(b[0], ids, b[1], b[2], b[3], ep=ep, swiglu_limit=limit)
    assert not torch.equal(out, exact), "bf16_intermediates changed nothing"
    for name, got, want in zip(["out", "grad_hidden", "grad_topk_weights", "grad_gate_up",
                                "grad_down"], [out] + list(grads), [want_out] + want_grads):
        assert got.shape == want.shape, name
        assert_close_fp32(name, got, want.float())


def test_bf16_inputs_are_widened_exactly():
    x, ids, w, gate_up, down, dout = make_case(2, 4, 16, 8, 4, 2, (), torch.int32, seed=7)
    b = [t.to(torch.bfloat16) for t in (x, w, gate_up, down, dout)]
    f = [t.float() for t in b]
    out_b = reference.forward(b[0], ids, b[1], b[2], b[3], ep=2, swiglu_limit=1.0)
    out_f = reference.forward(f[0], ids, f[1], f[2], f[3], ep=2, swiglu_limit=1.0)
    assert torch.equal(out_b, out_f)
    grads_b = reference.backward(b[4], b[0], ids, b[1], b[2], b[3], ep=2, swiglu_limit=1.0)
    grads_f = reference.backward(f[4], f[0], ids, f[1], f[2], f[3], ep=2, swiglu_limit=1.0)
    for gb, gf in zip(grads_b, grads_f):
        assert gb.dtype == torch.float32 and torch.equal(gb, gf)
    _, g64, _ = torch_grads(f[0], ids, f[1], f[2], f[3], f[4], 1.0, torch.float64)
    for name, got, exact in zip(["hidden", "w", "gate_up", "down"], grads_b, g64):
        assert_within_ulp(name, got, exact)


def test_leading_dims_are_kept():
    x, ids, w, gate_up, down, dout = make_case(1, 6, 8, 4, 2, 1, (), torch.int64, seed=3)
    out = reference.forward(x.reshape(2, 3, 8), ids, w, gate_up, down)
    assert out.shape == (2, 3, 8)
    assert torch.equal(out.reshape(6, 8), reference.forward(x, ids, w, gate_up, down))
    grads = reference.backward(dout.reshape(2, 3, 8), x.reshape(2, 3, 8), ids, w, gate_up, down)
    assert grads.hidden.shape == (2, 3, 8)


def test_errors():
    x, ids, w, gate_up, down, dout = make_case(2, 2, 8, 4, 4, 2, (), torch.int32, seed=1)
    bad = ids.clone()
    bad[3, 1] = 4
    with pytest.raises(MegaMoeError, match=r"topk_ids\[3, 1\] = 4") as info:
        reference.forward(x, bad, w, gate_up, down, ep=2)
    assert info.value.name == "INVALID_ARGUMENT"
    with pytest.raises(MegaMoeError, match="not divisible by ep 4"):
        reference.backward(dout, x, ids, w, gate_up[:3], down[:3], ep=4)  # 4 tokens, 3 experts
    with pytest.raises(ValueError, match="down has shape"):
        reference.forward(x, ids, w, gate_up, down[:, :, :4])
    with pytest.raises(ValueError, match="cannot be split over ep=3"):
        reference.forward(x, ids, w, gate_up, down, ep=3)
    with pytest.raises(ValueError, match="topk_weights has dtype"):
        reference.forward(x, ids, w.double(), gate_up, down)
