"""Every quantiser against an independent numpy implementation of
docs/v2_spec.md §4 (quantMode 1-4) and §5.2 (combine int8 transport), written here
from the spec text (fp8 by nearest-value search over the code table, not bit tricks). Rows
cover ties, saturation, zero / NaN / Inf rows, subnormals, odd H, bf16 and fp16 inputs, with
and without smooth scales, on the library's AVX-512 and scalar paths."""
import numpy as np
import pytest

from _kernels_lib import (BF16, E4M3, E5M2, FP16, INT8, bf16_bits_to_f32, f32_to_bf16_bits, lib,
                          ok, ptr, vector_mode)

f32 = np.float32
HS = [1, 7, 8, 9, 31, 33, 127, 128, 129, 257, 1000]


# ---- independent element conversions ---------------------------------------------------------

def widen(bits, xtype):
    bits = np.asarray(bits, dtype=np.uint16)
    return bf16_bits_to_f32(bits) if xtype == BF16 else bits.view(np.float16).astype(np.float32)


def to_xtype_bits(v, xtype):
    v = np.asarray(v, dtype=np.float32)
    return f32_to_bf16_bits(v) if xtype == BF16 else v.astype(np.float16).view(np.uint16)


def int8_rne(w):
    w = np.asarray(w, dtype=np.float64)
    r = np.rint(np.nan_to_num(w, nan=0.0, posinf=1e9, neginf=-1e9))  # rint: half to even
    return np.clip(r, -128, 127).astype(np.int8)


def _fp8_table(ebits, mbits, bias, e4m3fn):
    """Magnitudes of every finite code, plus the first value past the largest (overflow)."""
    vals = []
    for code in range(128):
        e, m = code >> mbits, code & ((1 << mbits) - 1)
        if e4m3fn and code == 0x7F:
            break  # NaN
        if not e4m3fn and e == (1 << ebits) - 1:
            break  # Inf / NaN
        vals.append(m * 2.0 ** (1 - bias - mbits) if e == 0 else (1 + m / 2 ** mbits) * 2.0 ** (e - bias))
    top = len(vals) - 1
    e, m = top >> mbits, top & ((1 << mbits) - 1)
    step = 2.0 ** (e - bias - mbits)
    return np.array(vals + [vals[-1] + step]), top


_E4M3 = _fp8_table(4, 3, 7, True)
_E5M2 = _fp8_table(5, 2, 15, False)


def fp8(w, qtype, saturate):
    """Round to nearest fp8 code, ties to the even code; overflow -> max (saturate) or
    NaN (e4m3fn) / Inf (e5m2); NaN -> sign | NaN code."""
    vals, top = _E4M3 if qtype == E4M3 else _E5M2
    nan_code, over_code = (0x7F, 0x7F) if qtype == E4M3 else (0x7E, 0x7C)
    out = np.empty(np.shape(w), dtype=np.uint8)
    for i, x in enumerate(np.asarray(w, dtype=np.float64).ravel()):
        sign = 0x80 if np.signbit(x) else 0
        if np.isnan(x):
            out.flat[i] = sign | nan_code
            continue
        a = abs(x)
        if np.isinf(a):
            out.flat[i] = sign | (top if saturate else over_code)
            continue
        j = int(np.searchsorted(vals, a))
        if j == 0:
            code = 0
        elif j >= len(vals):
            code = top + 1
        else:
            lo, hi = vals[j - 1], vals[j]
            if a - lo < hi - a:
                code = j - 1
            elif a - lo > hi - a:
                code = j
            else:
                code = j - 1 if (j - 1) % 2 == 0 else j
        if code > top:
            code = top if saturate else over_code
        out.flat[i] = sign | code
    return out


def absmax(v):
    return f32(np.nan) if np.isnan(v).any() else (np.max(np.abs(v)) if v.size else f32(0))


# ---- independent quantisers (the spec's steps, in fp32 numpy arithmetic) ----------------------

def ref_dynamic(v, qtype):
    qmax = {INT8: f32(127), E4M3: f32(448), E5M2: f32(57344)}[qtype]
    m = absmax(v)
    if m == 0:
        return np.zeros(v.size, np.int8 if qtype == INT8 else np.uint8), f32(0)
    with np.errstate(all="ignore"):
        d = f32(qmax / f32(m))
        w = (v * d).astype(np.float32)
        scale = f32(f32(1) / d)
    if qtype == INT8:
        return int8_rne(w), scale
    q = fp8(w, qtype, False)
    q[np.isnan(w)] = 0x7F if qtype == E4M3 else 0x7E  # positive canonical NaN
    return q, scale


def ref_v(bits, xtype, smooth):
    v = widen(bits, xtype)
    if smooth is not None:
        with np.errstate(all="ignore"):
            v = (v * smooth).astype(np.float32)
    return v


def ref_mx(bits, xtype, qtype):
    h = bits.size
    nblk = (h + 31) // 32
    nsc = (nblk + 1) // 2 * 2
    if xtype == BF16:
        field = (bits.astype(np.uint32) >> 7) & 0xFF
    else:
        field = (widen(bits, FP16).view(np.uint32) >> 23) & 0xFF
    x = widen(bits, xtype)
    emax = 8 if qtype == E4M3 else 15
    q = np.zeros(h, np.uint8)
    sc = np.zeros(nsc, np.uint8)
    for b in range(nblk):
        sl = slice(32 * b, min(32 * b + 32, h))
        E = int(field[sl].max())
        if E == 255:
            sc[b] = 0xFF
            q[sl] = 0x7F if qtype == E4M3 else 0x7E
        elif E == 0:
            sc[b] = 0
        else:
            s = max(E, emax) - emax
            sc[b] = s
            q[sl] = fp8(x[sl].astype(np.float64) * 2.0 ** (127 - s), qtype, True)
    return q, sc


def ref_comm_quant(bits, ytype):
    y = widen(bits, ytype)
    h = y.size
    nb = (h + 7) // 8
    q = np.zeros(h, np.int8)
    sx = np.zeros(nb, np.uint16)
    inv = f32(f32(1) / f32(127))
    for b in range(nb):
        blk = y[8 * b:8 * b + 8]
        s = f32(absmax(blk) * inv)
        sx[b] = to_xtype_bits(s, ytype)
        with np.errstate(all="ignore"):
            w = (blk / s).astype(np.float32)
        q[8 * b:8 * b + 8] = int8_rne(w.astype(np.float16).astype(np.float32))
    return q, sx


def ref_comm_dequant(q, sx, ytype):
    s = widen(sx, ytype)
    with np.errstate(all="ignore"):
        p = (q.astype(np.float32) * np.repeat(s, 8)[:q.size]).astype(np.float32)
    return to_xtype_bits(p, ytype)


# ---- rows -----------------------------------------------------------------------------------

def rows(xtype, seed):
    """(name, bits) rows of various lengths: random, wide-range, ties, saturation, special."""
    rng = np.random.default_rng(seed)
    out = []
    for h in HS:
        base = rng.standard_normal(h).astype(np.float32)
        out.append(("normal", to_xtype_bits(base * 3, xtype)))
        out.append(("wide", to_xtype_bits(base * np.exp2(rng.integers(-20, 12, h)).astype(np.float32), xtype)))
        # ties: halves and quarters with max 127 (int8 w = v) / 2^k multiples
        out.append(("ties", to_xtype_bits(np.concatenate([[127.0], rng.integers(-254, 255, h - 1) / 2.0])[:h], xtype)))
        out.append(("zero", np.zeros(h, np.uint16)))
        special = to_xtype_bits(base, xtype)
        special[h // 2] = 0x7FC0 if xtype == BF16 else 0x7E00  # NaN
        out.append(("nan", special))
        inf = to_xtype_bits(base, xtype)
        inf[0] = 0xFF80 if xtype == BF16 else 0xFC00  # -Inf
        out.append(("inf", inf))
        out.append(("bits", rng.integers(0, 1 << 16, h, dtype=np.uint64).astype(np.uint16)))
        sat = to_xtype_bits(np.full(h, 1.96875 * 2.0 ** 5, np.float32) * np.sign(base + 0.1), xtype)
        out.append(("saturate", sat))
        sub = to_xtype_bits(base * np.float32(2.0 ** -120 if xtype == BF16 else 2.0 ** -20), xtype)
        out.append(("tiny", sub))
    return out


XTYPES = [BF16, FP16]


@pytest.fixture(params=[True, False], ids=["avx512", "scalar"])
def path(request):
    with vector_mode(request.param):
        yield request.param


def _mismatch(name, got, want):
    bad = np.nonzero(got != want)[0]
    return f"{name}: {bad.size} mismatches, first at {bad[:3]}: got {got[bad[:3]]}, want {want[bad[:3]]}"


@pytest.mark.parametrize("xtype", XTYPES)
@pytest.mark.parametrize("qtype", [INT8, E4M3, E5M2])
def test_dynamic_per_token(path, xtype, qtype):
    rng = np.random.default_rng(3)
    for name, bits in rows(xtype, 1):
        h = bits.size
        for smooth in (None, (0.25 + rng.random(h)).astype(np.float32)):
            q = np.empty(h, np.int8 if qtype == INT8 else np.uint8)
            scale = np.zeros(1, np.float32)
            ok(lib.mm_quant_dynamic_token(ptr(bits), xtype, h, ptr(smooth), qtype, ptr(q), ptr(scale)))
            wq, ws = ref_dynamic(ref_v(bits, xtype, smooth), qtype)
            assert np.array_equal(q, wq), _mismatch(f"{name} h={h} smooth={smooth is not None}", q, wq)
            assert scale.view(np.uint32)[0] == np.array([ws], np.float32).view(np.uint32)[0] or \
                (np.isnan(scale[0]) and np.isnan(ws)), f"{name} h={h}: scale {scale[0]!r} want {ws!r}"


@pytest.mark.parametrize("xtype", XTYPES)
@pytest.mark.parametrize("qtype", [E4M3, E5M2])
def test_dynamic_per_group(path, xtype, qtype):
    rng = np.random.default_rng(4)
    for name, bits in rows(xtype, 2):
        h = bits.size
        for smooth in (None, (0.5 + rng.random(h)).astype(np.float32)):
            q = np.empty(h, np.uint8)
            sc = np.empty((h + 127) // 128, np.float32)
            ok(lib.mm_quant_dynamic_group(ptr(bits), xtype, h, ptr(smooth), qtype, ptr(q), ptr(sc)))
            v = ref_v(bits, xtype, smooth)
            for g in range(sc.size):
                wq, ws = ref_dynamic(v[128 * g:128 * g + 128], qtype)
                assert np.array_equal(q[128 * g:128 * g + 128], wq), _mismatch(f"{name} h={h} group {g}", q[128 * g:128 * g + 128], wq)
                assert sc[g] == ws or (np.isnan(sc[g]) and np.isnan(ws)), f"{name} group {g}: {sc[g]} vs {ws}"


@pytest.mark.parametrize("xtype", XTYPES)
def test_static_int8(path, xtype):
    rng = np.random.default_rng(5)
    for name, bits in rows(xtype, 3):
        h = bits.size
        for scales in (np.array([rng.random() * 50], np.float32), (rng.random(h) * 50).astype(np.float32)):
            q = np.empty(h, np.int8)
            ok(lib.mm_quant_static_int8(ptr(bits), xtype, h, ptr(scales), scales.size, ptr(q)))
            with np.errstate(all="ignore"):
                want = int8_rne((widen(bits, xtype) * scales).astype(np.float32))
            assert np.array_equal(q, want), _mismatch(f"{name} h={h} scales={scales.size}", q, want)


@pytest.mark.parametrize("xtype", XTYPES)
@pytest.mark.parametrize("qtype", [E4M3, E5M2])
def test_mx(xtype, qtype):
    for name, bits in rows(xtype, 6):
        h = bits.size
        nsc = ((h + 31) // 32 + 1) // 2 * 2
        q = np.empty(h, np.uint8)
        sc = np.full(nsc, 0x55, np.uint8)
        ok(lib.mm_quant_mx(ptr(bits), xtype, h, qtype, ptr(q), ptr(sc)))
        wq, wsc = ref_mx(bits, xtype, qtype)
        assert np.array_equal(sc, wsc), _mismatch(f"{name} h={h} scales", sc, wsc)
        assert np.array_equal(q, wq), _mismatch(f"{name} h={h}", q, wq)


@pytest.mark.parametrize("ytype", XTYPES)
def test_comm_int8_transport(path, ytype):
    for name, bits in rows(ytype, 7):
        h = bits.size
        q = np.empty(h, np.int8)
        sx = np.empty((h + 7) // 8, np.uint16)
        ok(lib.mm_comm_quant_int8(ptr(bits), ytype, h, ptr(q), ptr(sx)))
        wq, wsx = ref_comm_quant(bits, ytype)
        assert np.array_equal(q, wq), _mismatch(f"{name} h={h} q", q, wq)
        assert np.array_equal(sx, wsx), _mismatch(f"{name} h={h} scales", sx, wsx)
        back = np.empty(h, np.uint16)
        ok(lib.mm_comm_dequant_int8(ptr(q), ptr(sx), ytype, h, ptr(back)))
        want = ref_comm_dequant(q, sx, ytype)
        assert np.array_equal(back, want), _mismatch(f"{name} h={h} dequant", back, want)


def test_fp8_reference_is_sane():
    """The independent fp8 encoder against a few hand-known codes (guards the guard)."""
    assert list(fp8(np.array([448.0, 464.0, 465.0, 1.0, 2.0 ** -9, 2.0 ** -10, -0.0]), E4M3, False)) == \
        [0x7E, 0x7E, 0x7F, 0x38, 0x01, 0x00, 0x80]
    assert list(fp8(np.array([57344.0, 61440.0, 1e9, 2.0 ** -16, 1.0]), E5M2, False)) == \
        [0x7B, 0x7C, 0x7C, 0x01, 0x3C]
    assert list(fp8(np.array([1e9, -np.inf]), E4M3, True)) == [0x7E, 0xFE]
