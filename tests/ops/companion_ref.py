"""Independent plain-torch (float64) models of the companion operators (docs/ops.md
"Companion operators"), written from the spec, for tests/ops/test_companion_*.py and the
caller blocks. Slow and obvious on purpose: loops over groups and rows are fine here."""
import torch

F64 = torch.float64


def close(y, ref, what=""):
    """The bf16 block rule: |y - ref| <= 2e-2 |ref| + 2e-3 max(1, max |ref|), elementwise."""
    y = y.to(F64)
    ref = ref.to(F64)
    assert y.shape == ref.shape, f"{what}: shape {tuple(y.shape)} vs {tuple(ref.shape)}"
    tol = 2e-2 * ref.abs() + 2e-3 * max(1.0, float(ref.abs().max()) if ref.numel() else 1.0)
    bad = (y - ref).abs() > tol
    assert not bool(bad.any()), (f"{what}: {int(bad.sum())} of {ref.numel()} elements off, max "
                                 f"err {float((y - ref).abs().max()):.4g}")


def rel_l2(y, ref):
    y, ref = y.to(F64), ref.to(F64)
    return float((y - ref).norm() / max(float(ref.norm()), 1e-30))


def counts_of(group_list, group_list_type, groups):
    g = group_list.to(torch.int64)
    if group_list_type == 0:
        prev, out = 0, []
        for v in g.tolist():
            out.append(v - prev)
            prev = v
        return out + [0] * (groups - len(out))
    if group_list_type == 1:
        return g.tolist() + [0] * (groups - g.numel())
    out = [0] * groups
    for gid, c in g.tolist():
        if c == 0:
            break
        out[gid] += c
    return out


def gmm(x, w, counts, bias=None):
    """x [M, K] @ w[g] per group (float64), rows past the total zero."""
    m = x.shape[0]
    y = torch.zeros(m, w.shape[-1], dtype=F64)
    start = 0
    for g, c in enumerate(counts):
        if c:
            y[start:start + c] = x[start:start + c].to(F64) @ w[g].to(F64)
            if bias is not None:
                y[start:start + c] += bias[g].to(F64)
        start += c
    return y


def silu(a):
    return a * torch.sigmoid(a)


def swiglu(x, dim=-1):
    a, b = x.to(F64).chunk(2, dim=dim)
    return silu(a) * b


def clipped_glu(a, b, alpha, limit, bias):
    a = a.clamp(max=limit)
    b = b.clamp(-limit, limit)
    return a * torch.sigmoid(alpha * a) * (b + bias)


def quant_rows(v, qmax=127.0):
    """The npu_dynamic_quant rule on fp32 rows: s = max|v| / qmax (fp32), q = v / s rounded
    half away from zero, clamped to [-qmax, qmax]."""
    v = v.to(torch.float32)
    m = v.abs().amax(-1, keepdim=True)
    s = m / qmax
    w = v / torch.where(s > 0, s, torch.ones_like(s))
    q = torch.where(s > 0, torch.sign(w) * torch.floor(w.abs() + 0.5), torch.zeros_like(v))
    return q.clamp(-qmax, qmax).to(torch.int8), s.squeeze(-1)


def stable_order(keys, lo=None, hi=None):
    """Stable argsort of flat keys; keys outside [lo, hi) after all others."""
    keys = keys.reshape(-1).tolist()
    idx = list(range(len(keys)))
    inr = [i for i in idx if lo is None or lo <= keys[i] < hi]
    out = [i for i in idx if not (lo is None or lo <= keys[i] < hi)]
    inr.sort(key=lambda i: keys[i])
    return inr, out
