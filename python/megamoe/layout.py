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
