"""fp32/fp64 reference of the serving MegaMoE (spec §6, docs/serve.md "Math"), written
independently of the C code: it decodes the same weight tensors the operator gets and performs
the quantisation steps of each scene in fp32, the products in fp64.

Also the helpers a caller (tests, the example, the benchmark) needs to make quantised weights in
the operator's layouts: per-channel int8, packed int4 (int32 or int8 carriers), MX fp8 / fp4
with e8m0 scales, and the 64-bit scale container.

Scenes: "A16W16", "A8W8-INT", "A8W4-INT", "A8W8-FP", "A8W4-FP", "A4W4-FP".
"""
import math

import numpy as np
import torch

__all__ = ["activation", "quant_int8", "mx_quant_dequant", "decode_expert", "expert_ffn",
           "mega_moe_reference", "make_expert_weights", "rel_l2", "bf16_rule_ok",
           "scales_to_int64", "pack_int4", "quantize_mx", "FP8_E4M3", "FP8_E5M2", "FP4"]

FP8_E4M3, FP8_E5M2, FP4 = "fp8_e4m3fn", "fp8_e5m2", "fp4_e2m1"
_EMAX = {FP8_E4M3: 8, FP8_E5M2: 15, FP4: 2}


# ---- element types -------------------------------------------------------------------------

def _fp8_table(kind):
    """Value of every byte (NaN for NaN codes)."""
    vals = np.zeros(256, dtype=np.float64)
    mbits, bias = (3, 7) if kind == FP8_E4M3 else (2, 15)
    for b in range(256):
        s = -1.0 if b & 0x80 else 1.0
        e = (b >> mbits) & ((1 << (7 - mbits)) - 1)
        m = b & ((1 << mbits) - 1)
        if kind == FP8_E4M3 and e == 15 and m == 7:
            vals[b] = np.nan
        elif kind == FP8_E5M2 and e == 31:
            vals[b] = np.nan if m else s * np.inf
        elif e == 0:
            vals[b] = s * m * 2.0 ** (1 - bias - mbits)
        else:
            vals[b] = s * (1 + m / (1 << mbits)) * 2.0 ** (e - bias)
    return vals


_FP8 = {FP8_E4M3: _fp8_table(FP8_E4M3), FP8_E5M2: _fp8_table(FP8_E5M2)}
_FP4 = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6], np.float64)


def _encode(values, kind):
    """Round fp64 values to the nearest code of kind (ties to the even code), saturating."""
    table = _FP4 if kind == FP4 else _FP8[kind]
    codes = [c for c in range(len(table)) if np.isfinite(table[c]) and table[c] >= 0
             and not (table[c] == 0 and c != 0)]
    pos = np.array(sorted(codes, key=lambda c: table[c]))
    mags = table[pos]
    a = np.abs(values)
    a = np.minimum(a, mags[-1])  # saturate
    hi = np.clip(np.searchsorted(mags, a), 0, len(mags) - 1)
    lo = np.clip(hi - 1, 0, len(mags) - 1)
    dlo, dhi = np.abs(a - mags[lo]), np.abs(mags[hi] - a)
    pick = np.where(dlo < dhi, lo, np.where(dhi < dlo, hi, np.where(pos[lo] % 2 == 0, lo, hi)))
    code = pos[pick]
    neg = np.signbit(values)
    sign = 8 if kind == FP4 else 0x80
    return np.where(neg, code | sign, code).astype(np.uint8)


def _decode(codes, kind):
    table = _FP4 if kind == FP4 else _FP8[kind]
    return table[np.asarray(codes, dtype=np.int64)]


def _bf16_bits(t):
    return (t.to(torch.bfloat16).view(torch.int16).numpy().astype(np.int64) & 0xFFFF)


def mx_quant_dequant(x_bf16, kind):
    """MX blocks of 32 along the last dim of a bf16 tensor: the e8m0 scale byte
    s = max(E, emax) - emax from the largest bf16 exponent field E of the block (byte 0 and
    zeros for an all-zero-exponent block), elements cvt(x * 2^(127 - s)) to kind (RNE,
    saturating); returns (dequantised fp64 values q * 2^(s - 127), codes, scale bytes)."""
    x = x_bf16.to(torch.bfloat16)
    shape = x.shape
    h = shape[-1]
    flat = x.reshape(-1, h)
    bits = _bf16_bits(flat)
    vals = flat.double().numpy()
    nb = -(-h // 32)
    out = np.zeros_like(vals)
    codes = np.zeros(vals.shape, np.uint8)
    scales = np.zeros((vals.shape[0], nb), np.uint8)
    emax = _EMAX[kind]
    for b in range(nb):
        sl = slice(32 * b, min(h, 32 * b + 32))
        E = ((bits[:, sl] >> 7) & 0xFF).max(axis=1)
        s = np.where(E > emax, E - emax, 0)
        scales[:, b] = s
        w = vals[:, sl] * np.exp2(127.0 - s)[:, None]
        w = np.where((E == 0)[:, None], 0.0, w)
        c = _encode(w, kind)
        codes[:, sl] = c
        out[:, sl] = _decode(c, kind) * np.exp2(s - 127.0)[:, None]
    return (torch.from_numpy(out.reshape(shape)), torch.from_numpy(codes.reshape(shape)),
            torch.from_numpy(scales.reshape(tuple(shape[:-1]) + (nb,))))


def quant_int8(v):
    """Per-row int8 of an fp32 tensor [rows, h]: s = max|v| / 127 (fp32), q = round(v / s)
    half away from zero, clipped to [-127, 127]; zero rows give s = 0, q = 0. Returns (q as
    fp64, s as fp64 [rows, 1])."""
    v = v.float()
    m = v.abs().amax(dim=-1, keepdim=True)
    s = m / torch.tensor(127.0, dtype=torch.float32)
    safe = torch.where(s > 0, s, torch.ones_like(s))
    r = v / safe
    q = torch.sign(r) * torch.floor(r.abs() + 0.5)
    q = torch.where(s > 0, q.clamp(-127, 127), torch.zeros_like(q))
    return q.double(), s.double()


# ---- activations ------------------------------------------------------------------------

def activation(h, I, kind="swiglu", clamp=None, alpha=1.702, beta=1.0, linear_beta=None):
    """The gated activations of spec §6.2 on h = [g | u] (fp64)."""
    g, u = h[..., :I], h[..., I:2 * I]
    c = math.inf if not clamp else float(clamp)
    gc, uc = torch.clamp(g, max=c), torch.clamp(u, -c, c)
    if kind == "swiglu":
        return gc * torch.sigmoid(gc) * uc
    if kind == "swiglustep":
        return torch.clamp(g * torch.sigmoid(g), max=c) * uc
    if kind == "swigluoai":
        return gc * torch.sigmoid(alpha * gc) * (uc + beta)
    if kind == "situglu":
        lu = u if not linear_beta else linear_beta * torch.tanh(u / linear_beta)
        return beta * torch.tanh(g / beta) * torch.sigmoid(g) * lu
    raise ValueError(kind)


# ---- weights ----------------------------------------------------------------------------

def scales_to_int64(sigma):
    """fp32 scales in a 64-bit container (the fp32 bits in the low 32 bits), as vLLM builds them."""
    return sigma.float().contiguous().view(torch.int32).to(torch.int64) & 0xFFFFFFFF


def pack_int4(v, carrier="int32"):
    """int4 values [K, N] in [-8, 7] packed along N, two's complement, element 2j in the low
    nibble: int32 carrier [K, N/8] (8 per element, little-endian bytes) or int8 [K, N/2]."""
    v = np.asarray(v, dtype=np.int64) & 15
    K, N = v.shape
    per = 8 if carrier == "int32" else 2
    out = np.zeros((K, N // per), dtype=np.int64)
    for j in range(per):
        out |= v[:, j::per] << (4 * j)
    if carrier == "int32":
        return torch.from_numpy(out.astype(np.uint32).view(np.int32))
    return torch.from_numpy(out.astype(np.uint8).view(np.int8))


def _unpack_int4(t, N):
    a = t.contiguous().numpy()
    per = 8 if a.dtype == np.int32 else 2
    u = a.view(np.uint32 if per == 8 else np.uint8).astype(np.int64)
    out = np.zeros((a.shape[0], N), np.int64)
    for j in range(per):
        out[:, j::per] = (u >> (4 * j)) & 15
    return np.where(out >= 8, out - 16, out).astype(np.float64)


def quantize_mx(w_out_in, kind):
    """MX weights [out, in] (float) -> (uint8 codes [out, in] (fp8) or packed [out, in/2] (fp4),
    e8m0 scales uint8 [out, ceil(in/64), 2]); blocks of 32 along `in`."""
    out_dim, in_dim = w_out_in.shape
    _, codes, sc = mx_quant_dequant(w_out_in.to(torch.bfloat16), kind)
    nb = sc.shape[-1]
    sc2 = torch.zeros(out_dim, 2 * (-(-in_dim // 64)), dtype=torch.uint8)
    sc2[:, :nb] = sc
    if kind == FP4:
        c = codes.numpy().astype(np.uint8)
        codes = torch.from_numpy((c[:, 0::2] | (c[:, 1::2] << 4)).astype(np.uint8))
    return codes, sc2.view(out_dim, -1, 2)


def _scale_vec(t, n):
    t = t.contiguous()
    if t.dtype == torch.float32:
        return t.reshape(-1)[:n].double()
    bits = (t.reshape(-1)[:n] & 0xFFFFFFFF).to(torch.int64).numpy().astype(np.uint32)
    return torch.from_numpy(bits.view(np.float32).astype(np.float64))


def decode_expert(w1, w2, wtype, s1=None, s2=None, b1=None, b2=None):
    """One expert's weights as fp64 [in, out] matrices plus the integer-scene epilogue terms.
    wtype: "bf16", "int8", "int4", FP8_E4M3, FP8_E5M2, FP4."""
    d = {"wtype": wtype}
    if wtype == "bf16":
        d["W1"], d["W2"] = w1.double(), w2.double()
        return d
    if wtype in ("int8", "int4"):
        if wtype == "int8":
            V1, V2 = w1.double(), w2.double()
        else:
            H = w1.shape[0]
            per = 8 if w1.dtype == torch.int32 else 2
            V1 = torch.from_numpy(_unpack_int4(w1, w1.shape[1] * per))
            V2 = torch.from_numpy(_unpack_int4(w2, H))
        d["W1"], d["W2"] = V1, V2
        d["sig1"], d["sig2"] = _scale_vec(s1, V1.shape[1]), _scale_vec(s2, V2.shape[1])
        if wtype == "int4":
            d["off1"] = b1.double().reshape(-1) - 8 * (V1 * d["sig1"]).sum(0)
            d["off2"] = b2.double().reshape(-1) - 8 * (V2 * d["sig2"]).sum(0)
        return d
    # MX: [out, in] codes, e8m0 [out, ceil(in/64), 2]
    def dq(w, s):
        out_dim = w.shape[0]
        if wtype == FP4:
            c = w.contiguous().numpy().astype(np.uint8)
            codes = np.zeros((out_dim, c.shape[1] * 2), np.uint8)
            codes[:, 0::2], codes[:, 1::2] = c & 15, c >> 4
        else:
            codes = w.contiguous().view(torch.uint8).numpy()
        in_dim = codes.shape[1]
        sc = s.contiguous().view(torch.uint8).reshape(out_dim, -1).numpy().astype(np.float64)
        blk = np.arange(in_dim) // 32
        vals = _decode(codes, wtype) * np.exp2(sc[:, blk] - 127.0)
        return torch.from_numpy(vals.T.copy())  # [in, out]
    d["W1"], d["W2"] = dq(w1, s1), dq(w2, s2)
    return d


_SCENE_OF = {"bf16": "A16W16", "int8": "A8W8-INT", "int4": "A8W4-INT", FP8_E4M3: "A8W8-FP",
             FP8_E5M2: "A8W8-FP"}


def _quant_act(v, atype):
    """An activation (fp64) through the scene's quantiser: (values fed to the GEMM, per-row
    scale or None)."""
    if atype == "bf16":
        return v.to(torch.bfloat16).double(), None
    if atype == "int8":
        return quant_int8(v.float())
    dq, _, _ = mx_quant_dequant(v.float().to(torch.bfloat16), atype)
    return dq, None


def scene_types(wtype, a4w4=False):
    """(scene, dispatch type, GMM2-input type) of weights of wtype."""
    if wtype == FP4:
        return ("A4W4-FP", FP4, FP8_E4M3) if a4w4 else ("A8W4-FP", FP8_E4M3, FP8_E4M3)
    scene = _SCENE_OF[wtype]
    a = {"A16W16": "bf16", "A8W8-INT": "int8", "A8W4-INT": "int8"}.get(scene, wtype)
    return scene, a, a


def expert_ffn(x_bf16, d, act, a4w4=False):
    """F_e(x) (fp64 [rows, H]) for bf16 token rows with the decoded expert d."""
    _, a1t, a2t = scene_types(d["wtype"], a4w4)
    I = d["W2"].shape[0]
    q, s = _quant_act(x_bf16.double(), a1t)
    h = q @ d["W1"]
    if "sig1" in d:
        h = h * d["sig1"]
        if "off1" in d:
            h = h + d["off1"]
        h = h * s
    a = activation(h, I, **act)
    if a2t != "bf16" and a2t != "int8":
        a = a.float().to(torch.bfloat16).double()  # the MX quantiser reads bf16 activations
    q2, s2 = _quant_act(a, a2t)
    f = q2 @ d["W2"]
    if "sig2" in d:
        f = f * d["sig2"]
        if "off2" in d:
            f = f + d["off2"]
        f = f * s2
    return f


def combine_wire(f, combine_q):
    """An expert's output rows through the combine transport: combine_quant_mode 0 keeps fp64
    (the operator's bf16 rounding is inside the tolerance); 3 / 4: bf16, then MX fp8 e5m2 /
    e4m3fn blocks dequantised in fp32 with the 950 kernel's scale rule (byte << 23: a block
    with scale byte 0 comes back as 0)."""
    if not combine_q:
        return f
    kind = FP8_E5M2 if combine_q == 3 else FP8_E4M3
    dq, _, sc = mx_quant_dequant(f.float().to(torch.bfloat16), kind)
    zero = (sc == 0).repeat_interleave(32, dim=-1)[..., :f.shape[-1]]
    return torch.where(zero, torch.zeros_like(dq), dq)


def mega_moe_reference(x, ids, weights, experts, act, active=None, masked_ranks=(), L=None,
                       shared=None, a4w4=False, shared_a4w4=False, combine_q=0):
    """y (fp64 [n, H]) and the pair counts per global expert for one rank's tokens.

    experts: {global expert id: decoded expert (decode_expert)}; L: experts per rank (for the
    rank mask); shared: list of decoded shared experts (weight 1, on this rank's tokens);
    combine_q: the buffer's combine_quant_mode (combine_wire)."""
    n, K = ids.shape
    H = x.shape[1]
    y = torch.zeros(n, H, dtype=torch.float64)
    act_rows = torch.ones(n, dtype=torch.bool) if active is None else active.bool()
    counts = {}
    for t in range(n):
        if not act_rows[t]:
            continue
        for k in range(K):
            e = int(ids[t, k])
            if L is not None and e // L in masked_ranks:
                continue
            counts[e] = counts.get(e, 0) + 1
    # group rows by expert for speed
    for e in sorted(counts):
        rows = [(t, k) for t in range(n) if act_rows[t] for k in range(K)
                if int(ids[t, k]) == e]
        ts = torch.tensor([t for t, _ in rows])
        f = combine_wire(expert_ffn(x[ts], experts[e], act, a4w4), combine_q)
        w = torch.tensor([float(weights[t, k]) for t, k in rows], dtype=torch.float64)
        y.index_add_(0, ts, f * w[:, None])
    if shared:
        idx = torch.nonzero(act_rows).flatten()
        if len(idx):
            for d in shared:
                y[idx] += expert_ffn(x[idx], d, act, shared_a4w4)
    return y, counts


# ---- making weights ------------------------------------------------------------------------

def make_expert_weights(H, I, wtype, gen, scale=None, int4_carrier="int32", scale_container="fp32",
                        canonical_bias=False):
    """Random weights of one expert in the operator's layout for wtype: returns a dict with
    l1, l2 (and sf1, sf2, b1, b2 where the scene has them)."""
    scale = scale or (1.0 / math.sqrt(H))
    f1 = torch.randn(H, 2 * I, generator=gen) * scale
    f2 = torch.randn(I, H, generator=gen) * (1.0 / math.sqrt(I))
    if wtype == "bf16":
        return {"l1": f1.to(torch.bfloat16), "l2": f2.to(torch.bfloat16)}
    if wtype == "int8":
        out = {}
        for k, f in (("1", f1), ("2", f2)):
            sig = f.abs().amax(0) / 127
            q = torch.round(f / sig).clamp(-127, 127).to(torch.int8)
            out["l" + k] = q
            out["sf" + k] = sig if scale_container == "fp32" else scales_to_int64(sig)
        return out
    if wtype == "int4":
        out = {}
        for k, f in (("1", f1), ("2", f2)):
            sig = f.abs().amax(0) / 7
            v = torch.round(f / sig).clamp(-8, 7)
            out["l" + k] = pack_int4(v.numpy(), int4_carrier)
            out["sf" + k] = sig if scale_container == "fp32" else scales_to_int64(sig)
            colsum = (v.double() * sig.double()).sum(0)
            bias = 8 * colsum if canonical_bias else 8 * colsum + torch.randn(
                f.shape[1], generator=gen, dtype=torch.float64) * 0.01
            out["b" + k] = bias.float()
        return out
    codes1, sc1 = quantize_mx(f1.t().contiguous(), wtype)
    codes2, sc2 = quantize_mx(f2.t().contiguous(), wtype)
    return {"l1": codes1, "l2": codes2, "sf1": sc1, "sf2": sc2}


# ---- accuracy rules (spec §7) ------------------------------------------------------------

def rel_l2(y, ref):
    y, ref = y.double(), ref.double()
    den = ref.norm()
    return float((y - ref).norm() / den) if den > 0 else float((y - ref).norm())


def bf16_rule_ok(y, ref):
    """§7 for bf16 scenes: elementwise |y - ref| <= 2e-2 |ref| + 2e-3 max(1, max|ref|), or
    else relative L2 <= 1 %."""
    y, ref = y.double(), ref.double()
    if ref.numel() == 0:
        return True
    scale = max(1.0, float(ref.abs().max()))
    if bool(((y - ref).abs() <= 2e-2 * ref.abs() + 2e-3 * scale).all()):
        return True
    return rel_l2(y, ref) <= 0.01
