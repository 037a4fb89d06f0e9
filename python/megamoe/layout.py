"""Expert weight layouts: per-expert ``nn.Linear`` weights <-> the MegaMoE layout.

``gate_up_weight[e]`` is ``[H, 2I]`` (gate and up transposed, concatenated on the last dim) and
``down_weight[e]`` is ``[I, H]``, from ``gate_proj.weight [I, H]``, ``up_proj.weight [I, H]`` and
``down_proj.weight [H, I]`` (the C functions in ``include/megamoe/layout.h``). Tensors are CPU
torch tensors of dtype float32, bfloat16 or float16, stacked ``[E, ...]`` or one expert without
the leading dim; the results are new contiguous tensors.
"""
import ctypes

from . import _lib
from .errors import check

_i64 = ctypes.c_int64
_vp = ctypes.c_void_p
_lib.lib.megamoe_layout_gate_up_from_linear.argtypes = [_vp, _vp, _vp, ctypes.c_int, _i64, _i64, _i64]
_lib.lib.megamoe_layout_gate_up_to_linear.argtypes = [_vp, _vp, _vp, ctypes.c_int, _i64, _i64, _i64]
_lib.lib.megamoe_layout_down_from_linear.argtypes = [_vp, _vp, ctypes.c_int, _i64, _i64, _i64]
_lib.lib.megamoe_layout_down_to_linear.argtypes = [_vp, _vp, ctypes.c_int, _i64, _i64, _i64]
for _f in ("gate_up_from_linear", "gate_up_to_linear", "down_from_linear", "down_to_linear"):
    getattr(_lib.lib, "megamoe_layout_" + _f).restype = ctypes.c_int


def _dtype_code(t):
    import torch
    codes = {torch.float32: 0, torch.bfloat16: 1, torch.float16: 2}
    if t.dtype not in codes:
        raise TypeError(f"megamoe.layout: dtype {t.dtype} not supported (float32, bfloat16, float16)")
    if t.device.type != "cpu":
        raise TypeError("megamoe.layout: tensors must be on the CPU")
    return codes[t.dtype]


def _stacked(t, what):
    if t.dim() == 2:
        return t.unsqueeze(0).contiguous(), True
    if t.dim() == 3:
        return t.contiguous(), False
    raise ValueError(f"megamoe.layout: {what} must be [E, a, b] or [a, b], got {tuple(t.shape)}")


def gate_up_from_linear(gate, up):
    """``gate``, ``up``: ``[E, I, H]`` -> ``gate_up_weight [E, H, 2I]``."""
    import torch
    g, single = _stacked(gate, "gate")
    u, _ = _stacked(up, "up")
    if g.shape != u.shape or g.dtype != u.dtype:
        raise ValueError("megamoe.layout: gate and up must have the same shape and dtype")
    e, i, h = g.shape
    out = torch.empty((e, h, 2 * i), dtype=g.dtype)
    check(_lib.lib.megamoe_layout_gate_up_from_linear(out.data_ptr(), g.data_ptr(), u.data_ptr(),
                                                      _dtype_code(g), e, h, i))
    return out[0] if single else out


def gate_up_to_linear(gate_up):
    """``gate_up_weight [E, H, 2I]`` -> ``(gate [E, I, H], up [E, I, H])``."""
    import torch
    w, single = _stacked(gate_up, "gate_up")
    e, h, i2 = w.shape
    if i2 % 2:
        raise ValueError("megamoe.layout: gate_up's last dim must be 2I")
    i = i2 // 2
    gate = torch.empty((e, i, h), dtype=w.dtype)
    up = torch.empty((e, i, h), dtype=w.dtype)
    check(_lib.lib.megamoe_layout_gate_up_to_linear(gate.data_ptr(), up.data_ptr(), w.data_ptr(),
                                                    _dtype_code(w), e, h, i))
    return (gate[0], up[0]) if single else (gate, up)


def down_from_linear(down):
    """``down [E, H, I]`` -> ``down_weight [E, I, H]``."""
    import torch
    d, single = _stacked(down, "down")
    e, h, i = d.shape
    out = torch.empty((e, i, h), dtype=d.dtype)
    check(_lib.lib.megamoe_layout_down_from_linear(out.data_ptr(), d.data_ptr(), _dtype_code(d), e, h, i))
    return out[0] if single else out


def down_to_linear(down_weight):
    """``down_weight [E, I, H]`` -> ``down [E, H, I]``."""
    import torch
    d, single = _stacked(down_weight, "down_weight")
    e, i, h = d.shape
    out = torch.empty((e, h, i), dtype=d.dtype)
    check(_lib.lib.megamoe_layout_down_to_linear(out.data_ptr(), d.data_ptr(), _dtype_code(d), e, h, i))
    return out[0] if single else out


# ---- quantised expert weights (include/megamoe/layout.h; docs/kernels.md) -------------------
#
# A weight is [K, N] = [in, out] (mega_moe's and npu_grouped_matmul's int8/int4 orientation:
# gate_up_weight [H, 2I], down_weight [I, H]), or stacked [E, K, N]. Symmetric quantisation per
# output channel (group_size 0) or per group of group_size consecutive k (a multiple of 8):
# scale = max|W| / qmax (fp32), q = round half to even of W / scale clamped to [-qmax, qmax]
# (qmax 127 int8, 7 int4), an all-zero group has scale 0 and q = 0. int4 values are stored two
# per byte (two's complement, the even column in the low nibble), as an int8 tensor with the
# last dim halved; int4_to_int32 views it as CANN's int32 carrier (8 values per element).

_lib.lib.megamoe_quant_groups.argtypes = [_i64, _i64]
_lib.lib.megamoe_quant_groups.restype = _i64
_lib.lib.megamoe_quant_weight_int8.argtypes = [_vp, ctypes.c_int, _i64, _i64, _i64, _vp, _vp]
_lib.lib.megamoe_quant_weight_int4.argtypes = [_vp, ctypes.c_int, _i64, _i64, _i64, _vp, _vp]
_lib.lib.megamoe_int4_pack.argtypes = [_vp, _i64, _i64, _vp]
_lib.lib.megamoe_int4_unpack.argtypes = [_vp, _i64, _i64, _vp]
_lib.lib.megamoe_quant_w4a8_bias_pre.argtypes = [_vp, _i64, _i64, _vp, _i64, _vp, _vp]
for _f in ("quant_weight_int8", "quant_weight_int4", "int4_pack", "int4_unpack", "quant_w4a8_bias_pre"):
    getattr(_lib.lib, "megamoe_" + _f).restype = ctypes.c_int


def _weights3(w, what):
    """[E, K, N] contiguous view of a [K, N] or [E, K, N] tensor, and whether it was 2-D."""
    if w.dim() == 2:
        return w.unsqueeze(0).contiguous(), True
    if w.dim() == 3:
        return w.contiguous(), False
    raise ValueError(f"megamoe.layout: {what} must be [K, N] or [E, K, N], got {tuple(w.shape)}")


def _group_size(group_size, k):
    g = 0 if group_size is None else int(group_size)
    if g < 0 or g % 8:
        raise ValueError(f"megamoe.layout: group_size {group_size} must be 0/None (per channel) "
                         "or a positive multiple of 8")
    return g


def quant_groups(k, group_size=0):
    """Scale rows G of a weight with K input features: 1 per channel, ceil(K / group_size)."""
    return int(_lib.lib.megamoe_quant_groups(int(k), _group_size(group_size, k)))


def _quantize(w, group_size, int4):
    import torch
    x, single = _weights3(w, "w")
    e, k, n = x.shape
    g = _group_size(group_size, k)
    rows = quant_groups(k, g)
    code = _dtype_code(x)
    q = torch.empty((e, k, (n + 1) // 2 if int4 else n), dtype=torch.int8)
    scale = torch.empty((e, rows, n), dtype=torch.float32)
    fn = _lib.lib.megamoe_quant_weight_int4 if int4 else _lib.lib.megamoe_quant_weight_int8
    for i in range(e):
        check(fn(x[i].data_ptr(), code, k, n, g, q[i].data_ptr(), scale[i].data_ptr()))
    if g == 0:
        scale = scale[:, 0]
    return (q[0], scale[0]) if single else (q, scale)


def quantize_weight_int8(w, group_size=0):
    """``w [K, N]`` or ``[E, K, N]`` (float32/bfloat16/float16) -> ``(q int8 same shape, scale
    float32)``; scale is ``[N]`` (per channel) or ``[G, N]`` (per group), with a leading E when
    stacked."""
    return _quantize(w, group_size, False)


def quantize_weight_int4(w, group_size=0):
    """Like quantize_weight_int8 with int4 values in [-7, 7], packed two per byte: ``q`` is an int8
    tensor ``[..., K, ceil(N/2)]``."""
    return _quantize(w, group_size, True)


def pack_int4(values):
    """int values in [-8, 7], ``[..., n]`` -> packed int8 ``[..., ceil(n/2)]`` (low nibble first)."""
    import torch
    v = values.to(torch.int8).contiguous()
    n = v.shape[-1]
    rows = v.numel() // n if n else 0
    out = torch.empty(tuple(v.shape[:-1]) + ((n + 1) // 2,), dtype=torch.int8)
    check(_lib.lib.megamoe_int4_pack(v.data_ptr(), rows, n, out.data_ptr()))
    return out


def unpack_int4(packed, n=None):
    """Packed int8 ``[..., m]`` -> int8 values ``[..., n]`` (n = 2m by default, or 2m - 1)."""
    import torch
    p = packed.contiguous()
    if p.dtype not in (torch.int8, torch.uint8):
        raise TypeError(f"megamoe.layout.unpack_int4: packed must be int8 or uint8, got {p.dtype}")
    m = p.shape[-1]
    n = 2 * m if n is None else int(n)
    if (n + 1) // 2 != m:
        raise ValueError(f"megamoe.layout.unpack_int4: {m} packed bytes hold {2 * m - 1} or {2 * m} "
                         f"values, not {n}")
    rows = p.numel() // m if m else 0
    out = torch.empty(tuple(p.shape[:-1]) + (n,), dtype=torch.int8)
    check(_lib.lib.megamoe_int4_unpack(p.data_ptr(), rows, n, out.data_ptr()))
    return out


def int4_to_int32(packed):
    """Packed int4 ``[..., n/2]`` (int8) -> the int32 carrier ``[..., n/8]`` (same bytes)."""
    import torch
    if packed.shape[-1] % 4:
        raise ValueError("megamoe.layout.int4_to_int32: the packed last dim must be a multiple of "
                         "4 (8 values per int32)")
    return packed.contiguous().view(torch.int32)


def int4_from_int32(carrier):
    """The int32 carrier ``[..., n/8]`` -> packed int8 ``[..., n/2]`` (same bytes)."""
    import torch
    if carrier.dtype != torch.int32:
        raise TypeError(f"megamoe.layout.int4_from_int32: expected int32, got {carrier.dtype}")
    return carrier.contiguous().view(torch.int8)


def w4a8_bias_pre(packed, scale, bias=None, group_size=0):
    """The A8W4 term added before the token scale (mega_moe §6.3, npu_grouped_matmul W4A8):
    ``bias - 8 * sum_k V[k, n] * scale[g(k), n]`` in float32, ``[N]`` (``[E, N]`` when stacked).
    ``packed [..., K, N/2]`` int8, ``scale [..., N]`` or ``[..., G, N]``, ``bias [..., N]`` or None."""
    import torch
    p, single = _weights3(packed, "packed")
    e, k, pc = p.shape
    g = _group_size(group_size, k)
    rows = quant_groups(k, g)
    s = scale.to(torch.float32).contiguous().reshape(e, rows, -1)
    n = s.shape[-1]
    if (n + 1) // 2 != pc:
        raise ValueError(f"megamoe.layout.w4a8_bias_pre: scale has {n} columns, packed holds {2 * pc}")
    b = None if bias is None else bias.to(torch.float32).contiguous().reshape(e, n)
    out = torch.empty((e, n), dtype=torch.float32)
    for i in range(e):
        check(_lib.lib.megamoe_quant_w4a8_bias_pre(p[i].data_ptr(), k, n, s[i].data_ptr(), g,
                                                    None if b is None else b[i].data_ptr(),
                                                    out[i].data_ptr()))
    return out[0] if single else out
