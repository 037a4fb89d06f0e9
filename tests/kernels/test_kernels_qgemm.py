"""Quantised GEMMs and their helpers against independent numpy / torch implementations:
* mm_qgemm (W8A8 / W4A8, per channel and per K group, gathered rows, empty groups, int32 /
  fp32 / bf16 out, biases) bit-exact against exact int64 sums followed by the documented fp32
  steps in numpy float32, on the AVX-512 and scalar paths; weight-only (bf16 activations)
  against fp64 within the FMA chain's bound;
* the activation row quantisers (both rules) against numpy written from the spec text;
* megamoe.layout's weight quantisers, int4 packing, int32 carrier and A8W4 bias term against
  torch;
* an end-to-end A8W8 / A8W4 product of real-valued data within the mega_moe accuracy contract
  (relative L2 <= 3 %) of the fp32 product."""
import numpy as np
import pytest
import torch

from _kernels_lib import BF16, FP16, FP32, INT8, INT32, bf16_bits_to_f32, f32_to_bf16_bits, lib, ok, ptr, vector_mode
from megamoe import layout

f32 = np.float32
rng = np.random.default_rng(25)


def pack_int4_np(v):
    """[rows, cols] values in [-8, 7] -> [rows, ceil(cols/2)] bytes, low nibble first."""
    v = np.asarray(v, dtype=np.int64)
    if v.shape[-1] % 2:
        v = np.concatenate([v, np.zeros(v.shape[:-1] + (1,), np.int64)], axis=-1)
    lo, hi = v[..., 0::2] & 15, v[..., 1::2] & 15
    return (lo | (hi << 4)).astype(np.uint8)


def qgemm(vals, int4, layout_nk, gs, rows, a, a_type, c_type, index=None, xs=None, ws=None,
          wo=None, bpre=None, bpost=None, bi32=None):
    """Run mmt_qgemm_grouped; vals [E, K, N] int weights."""
    e, k, n = vals.shape
    src = np.ascontiguousarray(vals.transpose(0, 2, 1) if layout_nk else vals)
    if int4:
        src = pack_int4_np(src.reshape(-1, src.shape[-1])).reshape(e, src.shape[1], -1)
    else:
        src = src.astype(np.int8)
    src = np.ascontiguousarray(src)
    ld = src.shape[-1]
    r = int(np.sum(rows))
    c = np.zeros((r, n), dtype={FP32: np.float32, BF16: np.uint16, INT32: np.int32}[c_type])
    g_rows = np.asarray(rows, dtype=np.int64)
    idx = None if index is None else np.asarray(index, dtype=np.int32)
    arrs = [None if x is None else np.ascontiguousarray(x, dtype=np.float32) for x in (xs, ws, wo, bpre, bpost)]
    b32 = None if bi32 is None else np.ascontiguousarray(bi32, dtype=np.int32)
    ok(lib.mm_qgemm_grouped(int(int4), int(layout_nk), k, n, gs, ptr(src), ld, src[0].nbytes, e,
                            ptr(g_rows), a_type, ptr(a), ptr(idx), a.shape[0], *[ptr(x) for x in arrs],
                            ptr(b32), ptr(c), c_type))
    return c


def reference_int(vals, gs, rows, a, index, xs, ws, bpre, bpost, bi32, c_type):
    """Exact sums (int64), then the fp32 steps of kernels/qgemm.h in numpy float32."""
    e, k, n = vals.shape
    gsz = gs or k
    groups = (k + gsz - 1) // gsz
    out, r0 = [], 0
    for g, m in enumerate(rows):
        src = np.arange(r0, r0 + m) if index is None else np.asarray(index[r0:r0 + m])
        x = a[src].astype(np.int64)
        accs = [x[:, j * gsz:(j + 1) * gsz] @ vals[g, j * gsz:(j + 1) * gsz].astype(np.int64) for j in range(groups)]
        if c_type == INT32 or groups == 1:
            acc = (accs[0] if groups == 1 else None)
            a32 = acc.astype(np.int64)
            if bi32 is not None:
                a32 = a32 + bi32[g]
            a32 = ((a32 + 2**31) % 2**32 - 2**31).astype(np.int32)
            if c_type == INT32:
                out.append(a32)
                r0 += m
                continue
            s = a32.astype(f32)
            if ws is not None:
                s = s * ws[g, 0]
        else:
            s = None
            for j in range(groups):
                t = accs[j].astype(f32)
                if ws is not None:
                    t = t * ws[g, j]
                s = t if s is None else s + t
        if bpre is not None:
            s = s + bpre[g]
        if xs is not None:
            s = s * xs[src][:, None]
        if bpost is not None:
            s = s + bpost[g]
        out.append(s.astype(f32) if c_type == FP32 else f32_to_bf16_bits(s))
        r0 += m
    return np.concatenate(out, axis=0) if out else None


# (e, k, n, rows per expert, rows of A): single tiles and big blocks; and decode blocks of
# 7-36 rows, whose tiles share chunks of K (K = 600: several chunks, an odd quad count, K
# groups inside a chunk) with the next chunk prefetched by the tiles
QGEMM_I8_SHAPES = [(3, 100, 90, [5, 0, 40], 30), (4, 600, 130, [7, 13, 36, 8], 70)]


@pytest.mark.parametrize("int4", [0, 1])
@pytest.mark.parametrize("gs,c_type", [(0, FP32), (0, BF16), (0, INT32), (32, FP32), (32, BF16)])
@pytest.mark.parametrize("vector", [True, False])
@pytest.mark.parametrize("shape", QGEMM_I8_SHAPES, ids=["tiles_and_big", "decode_blocks"])
def test_qgemm_int8_activations_bit_exact(int4, gs, c_type, vector, shape):
    e, k, n, rows, na = shape
    lo, hi = (-8, 7) if int4 else (-128, 127)
    vals = rng.integers(lo, hi + 1, size=(e, k, n)).astype(np.int8)
    r = sum(rows)
    a = rng.integers(-128, 128, size=(na, k)).astype(np.int8)
    index = rng.integers(0, na, size=r).astype(np.int32)
    groups = (k + gs - 1) // gs if gs else 1
    fl = c_type != INT32
    xs = rng.uniform(0.001, 0.05, na).astype(f32) if fl else None
    ws = rng.uniform(-0.02, 0.02, (e, groups, n)).astype(f32) if fl else None
    bpre = rng.uniform(-2, 2, (e, n)).astype(f32) if fl else None
    bpost = rng.uniform(-1, 1, (e, n)).astype(f32) if fl else None
    bi32 = rng.integers(-1000, 1000, (e, n)).astype(np.int32) if not gs else None
    with vector_mode(vector):
        got = qgemm(vals, int4, int4, gs, rows, a, INT8, c_type, index, xs, ws, None, bpre, bpost, bi32)
    want = reference_int(vals, gs, rows, a, index, xs, ws, bpre, bpost, bi32, c_type)
    assert np.array_equal(got.view(np.uint32 if got.itemsize == 4 else np.uint16),
                          want.view(np.uint32 if want.itemsize == 4 else np.uint16))


@pytest.mark.parametrize("int4", [0, 1])
@pytest.mark.parametrize("gs", [0, 16])
def test_qgemm_weight_only_close_to_fp64(int4, gs):
    e, k, n = 2, 67, 70
    lo, hi = (-8, 7) if int4 else (-128, 127)
    vals = rng.integers(lo, hi + 1, size=(e, k, n)).astype(np.int8)
    rows = [3, 9]
    x = rng.uniform(-2, 2, (12, k)).astype(f32)
    xb = f32_to_bf16_bits(x)
    groups = (k + gs - 1) // gs if gs else 1
    ws = rng.uniform(-0.05, 0.05, (e, groups, n)).astype(f32)
    wo = rng.integers(-2, 3, (e, groups, n)).astype(f32)
    bpost = rng.uniform(-1, 1, (e, n)).astype(f32)
    for vector in (True, False):
        with vector_mode(vector):
            got = qgemm(vals, int4, 0, gs, rows, xb, BF16, FP32, None, None, ws, wo, None, bpost)
        xw = bf16_bits_to_f32(xb).astype(np.float64)
        gsz = gs or k
        for g, (r0, m) in enumerate([(0, 3), (3, 9)]):
            kg = np.arange(k) // gsz
            wd = (vals[g].astype(np.float64) + wo[g][kg]) * ws[g][kg]
            ref = xw[r0:r0 + m] @ wd + bpost[g]
            bound = (k + groups + 4) * 2.0**-24 * (np.abs(xw[r0:r0 + m]) @ np.abs(wd) + np.abs(bpost[g]))
            assert np.all(np.abs(got[r0:r0 + m] - ref) <= bound)


def sym127_np(x):
    """mega_moe §6.3 / npu_dynamic_quant from the spec text: s = max|x| / 127 (fp32), q = x / s
    rounded to nearest with ties away from zero, clipped to [-127, 127]; zero row: s = 0, q = 0."""
    x = np.asarray(x, dtype=f32)
    m = f32(np.max(np.abs(x))) if x.size else f32(0)
    if m == 0:
        return np.zeros(x.shape, np.int8), f32(0)
    s = f32(m / f32(127))
    w = (x / s).astype(np.float64)
    q = np.sign(w) * np.floor(np.abs(w) + 0.5)
    return np.clip(q, -127, 127).astype(np.int8), s


@pytest.mark.parametrize("xtype", [FP32, BF16, FP16])
@pytest.mark.parametrize("vector", [True, False])
def test_row_quantiser_sym127(xtype, vector):
    rows, h = 9, 333
    x = rng.standard_normal((rows, h)).astype(f32) * rng.uniform(0.01, 100, (rows, 1)).astype(f32)
    x[2] = 0
    x[3, :4] = [127, 62.5, -62.5, 0.5]  # exact ties after the division when max is 127
    x[3, 4:] = np.clip(x[3, 4:], -100, 100)
    if xtype == BF16:
        bits = f32_to_bf16_bits(x)
        xv = bf16_bits_to_f32(bits)
    elif xtype == FP16:
        bits = x.astype(np.float16).view(np.uint16)
        xv = bits.view(np.float16).astype(f32)
    else:
        bits, xv = x, x
    bits = np.ascontiguousarray(bits)
    q = np.zeros((rows, h), np.int8)
    s = np.zeros(rows, f32)
    with vector_mode(vector):
        ok(lib.mm_quant_rows_int8(1, ptr(bits), xtype, rows, h, h, None, ptr(q), h, ptr(s)))
    for r in range(rows):
        wq, ws_ = sym127_np(xv[r])
        assert s[r].view(np.uint32) == f32(ws_).view(np.uint32)
        assert np.array_equal(q[r], wq), r
    assert list(q[3, :4]) == [127, 63, -63, 1]


def test_row_quantiser_dispatch_rule_is_quant_mode_2():
    rows, h = 5, 100
    x = f32_to_bf16_bits(rng.standard_normal((rows, h)).astype(f32))
    q = np.zeros((rows, h), np.int8)
    s = np.zeros(rows, f32)
    ok(lib.mm_quant_rows_int8(0, ptr(x), BF16, rows, h, h, None, ptr(q), h, ptr(s)))
    for r in range(rows):
        v = bf16_bits_to_f32(x[r])
        d = f32(f32(127) / f32(np.max(np.abs(v))))
        assert s[r] == f32(f32(1) / d)
        assert np.array_equal(q[r], np.clip(np.rint(v * d), -128, 127).astype(np.int8))


# ---- megamoe.layout -----------------------------------------------------------------------------

def torch_quant(w, qmax, gs):
    """The documented rule in torch: scale = max|W| / qmax per (group, column), q = round (half
    to even) of W / scale clamped, zero groups scale 0 and q 0."""
    w = w.float()
    k, n = w.shape[-2:]
    gsz = gs or k
    qs, ss = [], []
    for g0 in range(0, k, gsz):
        blk = w[..., g0:g0 + gsz, :]
        s = blk.abs().amax(dim=-2, keepdim=True) / qmax
        q = torch.where(s == 0, torch.zeros_like(blk), torch.round(blk / torch.where(s == 0, torch.ones_like(s), s)))
        qs.append(q.clamp(-qmax, qmax).to(torch.int8))
        ss.append(s)
    scale = torch.cat(ss, dim=-2)
    return torch.cat(qs, dim=-2), (scale.squeeze(-2) if not gs else scale)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("gs", [0, 8, 64])
def test_layout_quantize_weights_match_torch(dtype, gs):
    torch.manual_seed(gs + 1)
    w = (torch.randn(3, 100, 37) * 0.05).to(dtype)
    w[1, :, 5] = 0  # an all-zero column
    q, s = layout.quantize_weight_int8(w, gs)
    tq, ts = torch_quant(w, 127.0, gs)
    assert q.dtype == torch.int8 and s.dtype == torch.float32
    assert torch.equal(s, ts) and torch.equal(q, tq)
    p4, s4 = layout.quantize_weight_int4(w[0], group_size=gs)
    tq4, ts4 = torch_quant(w[0], 7.0, gs)
    assert p4.shape == (100, 19) and torch.equal(s4, ts4)
    assert torch.equal(layout.unpack_int4(p4, 37), tq4)


def test_layout_int4_pack_and_int32_carrier():
    v = torch.randint(-8, 8, (5, 16), dtype=torch.int8)
    p = layout.pack_int4(v)
    want = (v[:, 0::2].to(torch.int16) & 15) | ((v[:, 1::2].to(torch.int16) & 15) << 4)
    assert torch.equal(p.view(torch.uint8).to(torch.int16), want)
    assert torch.equal(layout.unpack_int4(p), v)
    c = layout.int4_to_int32(p)
    assert c.dtype == torch.int32 and c.shape == (5, 2)
    u = c.to(torch.int64) & 0xFFFFFFFF
    for i in range(8):  # value 8m + i in bits 4i .. 4i+3
        assert torch.equal((u >> (4 * i)) & 15, v[:, i::8].to(torch.int64) & 15)
    assert torch.equal(layout.int4_from_int32(c), p)
    with pytest.raises(ValueError):
        layout.unpack_int4(p, 3)
    with pytest.raises(Exception):
        layout.pack_int4(torch.tensor([[8, 0]]))


def test_layout_w4a8_bias_pre():
    torch.manual_seed(3)
    w = torch.randn(2, 64, 32) * 0.1
    p, s = layout.quantize_weight_int4(w)
    v = layout.unpack_int4(p).double()
    canonical = (8 * (v * s.double()[:, None, :]).sum(dim=1)).float()
    pre = layout.w4a8_bias_pre(p, s, canonical)
    assert pre.shape == (2, 32) and pre.abs().max() < 1e-5
    pre0 = layout.w4a8_bias_pre(p[0], s[0])
    assert torch.allclose(pre0, -canonical[0], rtol=1e-6, atol=1e-6)
    pg, sg = layout.quantize_weight_int4(w[0], group_size=16)
    vg = layout.unpack_int4(pg).double()
    kg = torch.arange(64) // 16
    want = -8 * (vg * sg.double()[kg]).sum(dim=0)
    assert torch.allclose(layout.w4a8_bias_pre(pg, sg, group_size=16).double(), want, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("int4", [0, 1])
def test_end_to_end_a8w8_a8w4_within_the_accuracy_contract(int4):
    """Real-valued weights and tokens quantised with megamoe's helpers and multiplied by the
    kernel, against fp32 with the reference performing the weight quantisation step (mega_moe
    spec §7, integer scenes: relative L2 <= 3 %); int8 weights also against the plain fp32
    product (per-channel int4 of Gaussian weights is ~14 % off that by itself)."""
    torch.manual_seed(7)
    k, n, m = 512, 256, 16
    w = torch.randn(k, n) * 0.05
    x = torch.randn(m, k)
    if int4:
        p, s = layout.quantize_weight_int4(w)
        vals = layout.unpack_int4(p).numpy()
    else:
        q, s = layout.quantize_weight_int8(w)
        vals = q.numpy()
    xq = np.zeros((m, k), np.int8)
    xs = np.zeros(m, f32)
    xf = np.ascontiguousarray(x.numpy())
    ok(lib.mm_quant_rows_int8(1, ptr(xf), FP32, m, k, k, None, ptr(xq), k, ptr(xs)))
    bpre = None
    if int4:  # the canonical bias with the A8W4 correction: the plain int8 x int4 product
        canonical = (8 * (torch.from_numpy(vals).double() * s.double()).sum(0)).float()
        bpre = layout.w4a8_bias_pre(p, s, canonical).numpy()[None]
    y = qgemm(vals[None], int4, 0, 0, [m], xq, INT8, FP32, None, xs, s.numpy()[None, None], None,
              bpre, None)
    ref = (x.double() @ (torch.from_numpy(vals).double() * s.double())).numpy()
    rel = np.linalg.norm(y - ref) / np.linalg.norm(ref)
    assert rel <= 0.03, rel
    if not int4:
        ref = (x @ w).numpy()
        assert np.linalg.norm(y - ref) / np.linalg.norm(ref) <= 0.03
