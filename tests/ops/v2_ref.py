"""Independent numpy model of MoeDistributeDispatchV2 / CombineV2 / CombineAddRmsNorm, written
from docs/v2_spec.md (A3 behaviour) and docs/ops.md's numeric choices;
it never calls libmegamoe. One process simulates every rank of the world.

World layout (torch_npu's tests): world rank r has ep rank r // T and tp rank r % T (T =
max(tp_world_size, 1)); the EP group of tp rank p is {e * T + p}, the TP group of ep rank e is
{e * T, e * T + 1}. Element types travel as raw bits: bf16/fp16 as uint16, fp8/e8m0 as uint8.
"""
import numpy as np

f32 = np.float32
BF16, FP16, E4M3, E5M2, E8M0, INT8 = "bf16", "fp16", "e4m3", "e5m2", "e8m0", "int8"


# ---- element conversions ----------------------------------------------------------------------

def widen(bits, t):
    bits = np.asarray(bits, dtype=np.uint16)
    if t == BF16:
        return (bits.astype(np.uint32) << 16).view(np.float32)
    return bits.view(np.float16).astype(np.float32)


def narrow(v, t):
    """fp32 -> bf16/fp16 bits, round half to even (finite inputs)."""
    v = np.asarray(v, dtype=np.float32)
    if t == FP16:
        return v.astype(np.float16).view(np.uint16)
    u = v.view(np.uint32).astype(np.uint64)
    r = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
    return r.astype(np.uint16)


def int8_rne(w):
    w = np.nan_to_num(np.asarray(w, dtype=np.float64), nan=0.0, posinf=1e9, neginf=-1e9)
    return np.clip(np.rint(w), -128, 127).astype(np.int8)


def _fp8_codes(t):
    ebits, mbits, bias = (4, 3, 7) if t == E4M3 else (5, 2, 15)
    vals = []
    for code in range(128):
        e, m = code >> mbits, code & ((1 << mbits) - 1)
        if t == E4M3 and code == 0x7F:
            break
        if t == E5M2 and e == (1 << ebits) - 1:
            break
        vals.append(m * 2.0 ** (1 - bias - mbits) if e == 0 else (1 + m / 2 ** mbits) * 2.0 ** (e - bias))
    return np.array(vals)


_FP8 = {E4M3: _fp8_codes(E4M3), E5M2: _fp8_codes(E5M2)}


def fp8(w, t, saturate):
    """fp32 -> fp8 code by nearest value (ties to the even code); overflow saturates or gives
    NaN (e4m3fn, 0x7F) / Inf (e5m2, 0x7C); NaN gives the positive canonical NaN."""
    vals = _FP8[t]
    top = len(vals) - 1
    w = np.asarray(w, dtype=np.float64)
    a = np.abs(w)
    step = vals[top] - vals[top - 1]
    ext = np.append(vals, vals[top] + step)  # first value past the top (rounds to overflow)
    j = np.clip(np.searchsorted(ext, a), 1, len(ext) - 1)
    lo, hi = ext[j - 1], ext[j]
    code = np.where(a - lo < hi - a, j - 1, np.where(a - lo > hi - a, j, np.where((j - 1) % 2 == 0, j - 1, j)))
    code = np.where(a == 0, 0, code)
    over = (code > top) | np.isinf(a)
    code = np.where(over, top if saturate else (0x7F if t == E4M3 else 0x7C), code)
    out = (code.astype(np.uint8) | np.where(np.signbit(w), 0x80, 0).astype(np.uint8)).astype(np.uint8)
    return np.where(np.isnan(w), np.uint8(0x7F if t == E4M3 else 0x7E), out).astype(np.uint8)


def sum16(v):
    """The library's fixed summation order: 16 lanes, then pairwise (docs/ops.md)."""
    v = np.asarray(v, dtype=np.float32)
    n = (len(v) + 15) // 16 * 16
    p = np.zeros(n, np.float32)
    p[:len(v)] = v
    lanes = np.zeros(16, np.float32)
    for row in p.reshape(-1, 16):
        lanes = (lanes + row).astype(np.float32)
    for w in (8, 4, 2, 1):
        lanes[:w] = (lanes[:w] + lanes[w:2 * w]).astype(np.float32)
    return f32(lanes[0])


# ---- quantisation (spec §4, §5.2) ---------------------------------------------------------------

QMAX = {INT8: f32(127), E4M3: f32(448), E5M2: f32(57344)}


def _dyn(v, yt):
    m = f32(np.max(np.abs(v))) if v.size else f32(0)
    if m == 0:
        return np.zeros(v.size, np.uint8), f32(0)
    d = f32(QMAX[yt] / m)
    w = (v * d).astype(np.float32)
    q = int8_rne(w).view(np.uint8) if yt == INT8 else fp8(w, yt, False)
    return q, f32(f32(1) / d)


def quant_row(xbits, xt, mode, yt, smooth):
    """One token row -> (payload bits as uint8 (or uint16 for mode 0), scale bytes)."""
    if mode == 0:
        return np.asarray(xbits, np.uint16).copy(), np.zeros(0, np.uint8)
    h = len(xbits)
    v = widen(xbits, xt)
    if smooth is not None and mode in (1, 2, 3):
        v = (v * np.broadcast_to(np.asarray(smooth, np.float32), (h,))).astype(np.float32)
    if mode == 1:
        return int8_rne(v).view(np.uint8), np.zeros(0, np.uint8)
    if mode == 2:
        q, s = _dyn(v, yt)
        return q, np.array([s], np.float32).view(np.uint8)
    if mode == 3:
        qs, ss = [], []
        for g in range(0, h, 128):
            q, s = _dyn(v[g:g + 128], yt)
            qs.append(q)
            ss.append(s)
        return np.concatenate(qs), np.array(ss, np.float32).view(np.uint8)
    # mode 4: MX
    return mx_quant(xbits, xt, yt)


def mx_quant(xbits, xt, yt):
    """MX (spec §4.4): fp8 codes [h] and align2(ceil(h/32)) E8M0 scale bytes (pad block 0)."""
    h = len(xbits)
    emax_elem = 8 if yt == E4M3 else 15
    nb = (h + 31) // 32
    ns = (nb + 1) // 2 * 2
    xf = widen(xbits, xt)
    ef = ((xf.view(np.uint32) >> 23) & 0xFF).astype(np.int64)  # exponent of bf16(x)
    q = np.zeros(h, np.uint8)
    sc = np.zeros(ns, np.uint8)
    for b in range(nb):
        sl = slice(32 * b, min(h, 32 * b + 32))
        em = int(ef[sl].max())
        if em == 255:
            sc[b] = 0xFF
            q[sl] = 0x7F if yt == E4M3 else 0x7E
        elif em == 0:
            sc[b] = 0
        else:
            s = max(em, emax_elem) - emax_elem
            sc[b] = s
            r = f32(np.ldexp(1.0, 127 - s))
            q[sl] = fp8((xf[sl] * r).astype(np.float32), yt, True)
    return q, sc


def fp8_value(codes, t):
    """fp8 code -> fp32 from the bit fields (e4m3fn: 0x7F/0xFF NaN, no Inf; e5m2: IEEE-like)."""
    codes = np.asarray(codes, np.uint8).astype(np.int64)
    ebits, mbits, bias = (4, 3, 7) if t == E4M3 else (5, 2, 15)
    sign = np.where(codes & 0x80, -1.0, 1.0)
    e = (codes >> mbits) & ((1 << ebits) - 1)
    m = codes & ((1 << mbits) - 1)
    mag = np.where(e == 0, m * 2.0 ** (1 - bias - mbits), (1 + m / 2.0 ** mbits) * 2.0 ** (e - bias))
    if t == E4M3:
        mag = np.where((codes & 0x7F) == 0x7F, np.nan, mag)
    else:
        top = e == (1 << ebits) - 1
        mag = np.where(top & (m == 0), np.inf, np.where(top, np.nan, mag))
    return (sign * mag).astype(np.float32)


def mx_dequant(q, sc, t):
    """The 950 combine's MX dequantisation: fp32 scale = the byte shifted into the fp32 exponent
    field (byte << 23: 0 -> +0, 0xFF -> +Inf), y' = fl32(fp8 * scale); no rounding to XType."""
    q = np.asarray(q, np.uint8)
    scale = (np.asarray(sc, np.uint32) << 23).view(np.float32)
    blk = scale[np.arange(len(q)) // 32]
    with np.errstate(all="ignore"):
        return (fp8_value(q, t) * blk).astype(np.float32)


def cq_roundtrip(ybits, xt):
    """Combine int8 transport, blocks of 8: y -> q, sx -> y' (XType bits)."""
    h = len(ybits)
    y = widen(ybits, xt)
    out = np.zeros(h, np.uint16)
    inv = f32(f32(1) / f32(127))
    for b in range(0, h, 8):
        blk = y[b:b + 8]
        m = f32(np.max(np.abs(blk)))
        s = f32(m * inv)
        sx = narrow(np.array([s]), xt)[0]
        with np.errstate(all="ignore"):
            w = (blk / s).astype(np.float32)
        q = int8_rne(w.astype(np.float16).astype(np.float32))
        p = (q.astype(np.float32) * widen(np.array([sx]), xt)[0]).astype(np.float32)
        out[b:b + 8] = narrow(p, xt)
    return out


def cq_value(ybits, xt, cq):
    """What the source adds for one expert row y (XType bits), as fp32: the row itself (0), the
    int8 transport rounded back to XType (2), or the MX transport's fp32 dequantisation (3: e5m2,
    4: e4m3fn, spec §4.4 quantiser)."""
    if cq == 0:
        return widen(ybits, xt)
    if cq == 2:
        return widen(cq_roundtrip(ybits, xt), xt)
    t = E5M2 if cq == 3 else E4M3
    q, sc = mx_quant(ybits, xt, t)
    return mx_dequant(q, sc, t)


# ---- configuration -------------------------------------------------------------------------------

class Cfg:
    def __init__(self, c):
        self.W, self.E, self.K, self.H = c["W"], c["E"], c["K"], c["H"]
        self.S = c.get("S", 0)
        self.NS = c.get("NS", 1)
        if self.S == 0 and self.NS == 1:
            self.NS = 0
        self.Z, self.Cp, self.Cn = c.get("Z", 0), c.get("Cp", 0), c.get("Cn", 0)
        self.tp = c.get("tp", 0)
        self.T = max(self.tp, 1)
        self.quant = c.get("quant", 0)
        self.xt = c.get("xt", BF16)
        self.yt = c.get("yt") or (self.xt if self.quant == 0 else INT8 if self.quant <= 2 else E4M3)
        self.L = self.E // (self.W - self.S)
        self.gbs = c.get("global_bs", 0)
        self.ent = c.get("ent", 1)
        self.cq = c.get("comm_quant", 0)
        self.hier = c.get("hier", 0)  # group size for comm_alg "hierarchy" (0: fullmesh)
        self.elastic = c.get("elastic")  # list [isScaled, nW, nS, nE, table1..., table2...]

    def scale_elems(self):
        return {0: 0, 1: 0, 2: 1, 3: (self.H + 127) // 128, 4: ((self.H + 31) // 32 + 1) // 2 * 2}[self.quant]


def capacities(cfg, rank, bs):
    gbs_real = cfg.gbs or bs * cfg.W
    max_bs = gbs_real // cfg.W
    moeA = gbs_real * min(cfg.L, cfg.K)
    rpse0 = cfg.S // cfg.NS if cfg.NS else 1
    sharedA = max_bs * ((cfg.W + rpse0 - 1) // rpse0) if cfg.NS else 0
    if cfg.elastic is not None:
        A = moeA if (cfg.S == 0 or moeA > sharedA) else sharedA
        L_out = cfg.L
    elif rank < cfg.S:
        A, L_out = sharedA, 1
    else:
        A, L_out = moeA, cfg.L
    return A, L_out, gbs_real, max_bs


def effective(cfg):
    """(eW, eS, eE, table1 physical->compact, table2 compact->physical)."""
    W = cfg.W
    if cfg.elastic is not None and cfg.elastic[0] == 1:
        el = cfg.elastic
        return el[1], el[2], el[3], list(el[4:4 + W]), list(el[4 + W:4 + 2 * W])
    return W, cfg.S, cfg.E, list(range(W)), list(range(W))


def active_tokens(bs, K, mask):
    if mask is None:
        return np.ones(bs, bool)
    mask = np.asarray(mask, bool)
    return mask if mask.ndim == 1 else mask.any(axis=1)


# ---- dispatch --------------------------------------------------------------------------------------

def dispatch_group(cfg, inp, expert_scales_given):
    """One EP group. inp[r] (physical ep rank r): dict x (bits [bs, H]), ids [bs, K],
    mask (None, [bs], [bs, K]), scales ([NS + E, H] or [1]/[H] or None), ws ([bs, K] or None).
    Returns per physical rank: rows (list of (payload, scale bytes)), triples, counts block
    array, per-block counts, expand scales."""
    W, K, NS = cfg.W, cfg.K, cfg.NS
    eW, eS, eE, t1, t2 = effective(cfg)
    L = cfg.L
    rpse = eS // NS if NS else 1
    # blocks[dst][(le, src)] = list of (src, t, k, payload, scale, w)
    blocks = {d: {} for d in range(eW)}
    for c in range(eW):
        r = t2[c]
        d_in = inp[r]
        x, ids, mask, ws = d_in["x"], d_in["ids"], d_in.get("mask"), d_in.get("ws")
        scales = d_in.get("scales")
        bs = ids.shape[0]
        act = active_tokens(bs, K, mask)
        for t in range(bs):
            if not act[t]:
                continue
            for k in range(K):
                if mask is not None and np.ndim(mask) == 2 and not mask[t][k]:
                    continue
                e = int(ids[t, k])
                if e >= eE:
                    continue
                dst, le = eS + e // L, e % L
                sm = None
                if scales is not None:
                    sm = scales if np.ndim(scales) == 1 else scales[NS + e]
                pay, sc = quant_row(x[t], cfg.xt, cfg.quant, cfg.yt, sm)
                w = f32(ws[t, k]) if ws is not None else f32(0)
                blocks[dst].setdefault((le, c), []).append((c, t, k, pay, sc, w))
            for j in range(NS):
                dst = c % rpse + j * rpse
                sm = None
                if scales is not None:
                    sm = scales if np.ndim(scales) == 1 else scales[j]
                pay, sc = quant_row(x[t], cfg.xt, cfg.quant, cfg.yt, sm)
                blocks[dst].setdefault((0, c), []).append((c, t, K + j, pay, sc, f32(1)))
    out = {}
    for d in range(eW):
        r = t2[d]
        Ld = 1 if d < eS else L
        rows, counts, acc = [], [], 0
        for le in range(Ld):
            for s in range(eW):
                rows.extend(blocks[d].get((le, s), []))
                acc += len(blocks[d].get((le, s), []))
                counts.append(acc)
        out[r] = {"rows": rows, "counts": counts, "L": Ld, "eW": eW}
    for r in range(W):
        if r not in out:  # removed by elastic_info
            out[r] = {"rows": [], "counts": [], "L": 0, "eW": eW}
    return out


def expand_idx_v1(ids, mask, E):
    """torch_npu V1 dispatch's expand_idx [BS * K] (int32), from its docs and the A3 V1 kernel:
    for pair i = t * K + k, the number of earlier pairs j < i sent to the same expert (the row's
    place in its (source, expert) block, spec §3.2). Our extension: pairs a mask keeps back are
    not sent, are not counted and hold 0."""
    bs, K = ids.shape
    act = np.ones((bs, K), bool)
    if mask is not None:
        m = np.asarray(mask, bool)
        act = np.repeat(m[:, None], K, axis=1) if m.ndim == 1 else m
    seen = {}
    out = np.zeros(bs * K, np.int32)
    for i in range(bs * K):
        t, k = divmod(i, K)
        e = int(ids[t, k])
        if not act[t, k] or e >= E:
            continue
        out[i] = seen.get(e, 0)
        seen[e] = out[i] + 1
    return out


def dispatch_world(case, world_inputs):
    """All world ranks; returns the seven outputs of each world rank as numpy arrays."""
    cfg = Cfg(case)
    T, W = cfg.T, cfg.W
    n = W * T
    ep_out = {}
    for p in range(T):
        inp = {e: world_inputs[e * T + p] for e in range(W)}
        res = dispatch_group(cfg, inp, True)
        for e in range(W):
            ep_out[e * T + p] = res[e]
    results = {}
    for wr in range(n):
        e, p = wr // T, wr % T
        bs = world_inputs[wr]["ids"].shape[0]
        A, L_out, gbs_real, max_bs = capacities(cfg, e, bs)
        H, se = cfg.H, cfg.scale_elems()
        o = ep_out[wr]
        own = o["rows"]
        peer = ep_out[e * T + (1 - p)]["rows"] if cfg.tp == 2 else []
        allrows = own + peer
        pay_dtype = np.uint16 if cfg.quant == 0 else np.uint8
        ex = np.zeros((T * A, H), pay_dtype)
        sb = 1 if cfg.quant == 4 else 4
        dyn = np.zeros(T * A * max(se, 1) * sb if se else T * A * 4, np.uint8)
        for i, row in enumerate(allrows):
            ex[i] = row[3]
            if se:
                dyn[i * se * sb:(i + 1) * se * sb] = row[4]
        nass = max(bs * cfg.K, 128 * A)
        assist = np.zeros(nass, np.int32)
        for i, row in enumerate(own):
            assist[3 * i:3 * i + 3] = (row[0], row[1], row[2])
        counts_len = W * L_out * (2 if cfg.tp == 2 else 1)
        ncount = counts_len
        if world_inputs[wr].get("ws") is not None:
            ncount = max(counts_len, W * L_out + 2 * gbs_real * cfg.K * (W // 8))
        counts = np.zeros(ncount, np.int32)
        counts[:len(o["counts"])] = o["counts"]
        tok = np.zeros(L_out, np.int64)
        n_peer = len(peer)
        cum = 0
        for le in range(o["L"]):
            eWv = o["eW"]
            hi = o["counts"][le * eWv + eWv - 1]
            lo = o["counts"][le * eWv - 1] if le else 0
            cnt = hi - lo + (n_peer if cfg.tp == 2 else 0)
            cum += cnt
            tok[le] = cum if cfg.ent == 0 else cnt
        tpc = np.zeros(cfg.tp, np.int32)
        if cfg.tp == 2:
            counts[W:2 * W] = ep_out[e * T + (1 - p)]["counts"]
            tpc[p], tpc[1 - p] = len(own), n_peer
        esc = np.zeros(A, np.float32)
        if world_inputs[wr].get("ws") is not None:
            for i, row in enumerate(own):
                esc[i] = row[5]
        if cfg.quant == 3:
            dyn_arr = dyn.view(np.float32).reshape(T * A, se)
        elif cfg.quant == 4:
            dyn_arr = dyn.reshape(T * A, se)
        else:
            dyn_arr = dyn.view(np.float32)
        results[wr] = {"expand_x": ex, "dynamic_scales": dyn_arr, "assist": assist, "tok": tok,
                       "counts": counts, "tp_counts": tpc, "expand_scales": esc,
                       "n_own": len(own), "n_peer": n_peer, "A": A}
    return results


# ---- combine ---------------------------------------------------------------------------------------

def _const_expert(cfg, ori, a1row, a2row, vrow, w, acc):
    xf = widen(ori, cfg.xt)
    al = []
    for arow in (a1row, a2row):
        al.append(sum16((widen(arow, cfg.xt) * xf).astype(np.float32)))
    m = max(al[0], al[1])
    e0 = f32(np.exp(np.float64(f32(al[0] - m))))
    e1 = f32(np.exp(np.float64(f32(al[1] - m))))
    s = f32(e0 + e1)
    p1, p2 = f32(e0 / s), f32(e1 / s)
    u = (xf * p1).astype(np.float32)
    v = (widen(vrow, cfg.xt) * p2).astype(np.float32)
    val = (u + v).astype(np.float32)
    return (acc + (val * f32(w)).astype(np.float32)).astype(np.float32)


def combine_world(case, world_inputs, disp, expert_out, arn=None):
    """Combine for every world rank. expert_out[wr]: [T*A, H] XType bits (the experts'
    results, including partial rows for the TP peer). Returns x bits [bs, H] per world rank
    (and y, rstd for add+RMSNorm), rows of unprocessed tokens zero."""
    cfg = Cfg(case)
    T, W, K, NS, H = cfg.T, cfg.W, cfg.K, cfg.NS, cfg.H
    eW, eS, eE, t1, t2 = effective(cfg)
    KS = K + NS
    gs = cfg.hier
    # expert side: rows after the TP add (and transport quantisation), keyed by destination
    slots = {}  # (world rank of source, t, k') -> (fp32 y', group of the expert rank)
    for wr in range(W * T):
        e, p = wr // T, wr % T
        if t1[e] < 0:
            continue  # removed by elastic_info
        n_own = disp[wr]["n_own"]
        rows = expert_out[wr][:n_own].copy()
        if cfg.tp == 2:
            pr = e * T + (1 - p)
            pn = disp[pr]["n_own"]
            part = expert_out[pr][pn:pn + n_own]
            for i in range(n_own):
                if cfg.xt == BF16:
                    rows[i] = narrow((widen(rows[i], BF16) + widen(part[i], BF16)).astype(np.float32), BF16)
                else:
                    rows[i] = (widen(rows[i], FP16).astype(np.float64) +
                               widen(part[i], FP16).astype(np.float64)).astype(np.float16).view(np.uint16)
        assist = disp[wr]["assist"]
        my_compact = t1[e]
        for i in range(n_own):
            s, t, k = assist[3 * i:3 * i + 3]
            y = cq_value(rows[i], cfg.xt, cfg.cq)
            src_world = t2[s] * T + p
            slots[(src_world, int(t), int(k))] = (y, my_compact // gs if gs else 0)
    out = {}
    for wr in range(W * T):
        e, p = wr // T, wr % T
        inp = world_inputs[wr]
        ids, mask, ws = inp["ids"], inp.get("mask"), inp["cws"]
        bs = ids.shape[0]
        x = np.zeros((bs, H), np.uint16)
        y_out = np.zeros((bs, H), np.uint16)
        rstd = np.zeros(bs, np.float32)
        removed = cfg.elastic is not None and cfg.elastic[0] == 1 and t1[e] < 0
        act = active_tokens(bs, K, mask) if not removed else np.zeros(bs, bool)
        c = t1[e]
        ngroups = (eW + gs - 1) // gs if gs else 1
        rpse = eS // NS if NS else 1
        for t in range(bs):
            if not act[t]:
                continue
            acc = np.zeros(H, np.float32)
            if gs:  # hierarchy: partial per group in slot order, groups in order
                parts = {}
                for kk in range(KS):
                    if kk < K:
                        if mask is not None and np.ndim(mask) == 2 and not mask[t][kk]:
                            continue
                        eid = int(ids[t, kk])
                        if eid >= eE:
                            continue
                        grp = (eS + eid // cfg.L) // gs
                    else:
                        grp = (c % rpse + (kk - K) * rpse) // gs
                    yv, _ = slots[(wr, t, kk)]
                    part = parts.setdefault(grp, np.zeros(H, np.float32))
                    if kk < K:
                        parts[grp] = (part + (yv * f32(ws[t, kk])).astype(np.float32)).astype(np.float32)
                    else:
                        parts[grp] = (part + yv).astype(np.float32)
                for grp in sorted(parts):
                    acc = (acc + parts[grp]).astype(np.float32)
            for kk in range(K):
                if mask is not None and np.ndim(mask) == 2 and not mask[t][kk]:
                    continue
                eid = int(ids[t, kk])
                w = f32(ws[t, kk])
                if eid < cfg.E:
                    if gs:
                        continue
                    yv = slots[(wr, t, kk)][0]
                    acc = (acc + (yv * w).astype(np.float32)).astype(np.float32)
                elif eid < cfg.E + cfg.Z:
                    pass
                elif eid < cfg.E + cfg.Z + cfg.Cp:
                    acc = (acc + (widen(inp["ori_x"][t], cfg.xt) * w).astype(np.float32)).astype(np.float32)
                else:
                    ci = eid - (cfg.E + cfg.Z + cfg.Cp)
                    acc = _const_expert(cfg, inp["ori_x"][t], inp["alpha1"][ci], inp["alpha2"][ci],
                                        inp["const_v"][ci], w, acc)
            if not gs:
                for j in range(NS):
                    yv = slots[(wr, t, K + j)][0]
                    acc = (acc + yv).astype(np.float32)
            if inp.get("sxx") is not None:
                acc = (acc + widen(inp["sxx"][t], cfg.xt)).astype(np.float32)
            if arn is None:
                x[t] = narrow(acc, cfg.xt)
                continue
            s = (acc + widen(arn[wr]["residual"][t], cfg.xt)).astype(np.float32)
            x[t] = narrow(s, cfg.xt)
            inv_h = f32(f32(1) / f32(H))
            sq = ((s * s).astype(np.float32) * inv_h).astype(np.float32)
            ms = f32(sum16(sq) + f32(arn[wr]["eps"]))
            r = f32(f32(1) / f32(np.sqrt(ms)))
            rstd[t] = r
            yb = narrow((s * r).astype(np.float32), cfg.xt)
            y_out[t] = narrow((widen(yb, cfg.xt) * widen(arn[wr]["gamma"], cfg.xt)).astype(np.float32), cfg.xt)
        out[wr] = {"x": x, "y": y_out, "rstd": rstd}
    return out
