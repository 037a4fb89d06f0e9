"""The fp32 reference model of the MegaMoE math on torch CPU tensors (the test oracle).

A thin wrapper over include/megamoe/reference.h, which documents the math, the clamp rule and
the precision (fp64 accumulation, one rounding to fp32). Tensors are the global, rank-major
ones: ``hidden`` [EP*T, H] (or [..., H]), ``topk_ids`` [EP*T, K] int32/int64 global expert ids,
``topk_weights`` [EP*T, K], ``gate_up`` [E, H, 2I], ``down`` [E, I, H]; floating inputs are
float32 or bfloat16, results are float32; ``swiglu_limit`` reaches C as a float32. Errors from
the library raise MegaMoeError; tensors of the wrong shape, dtype or device raise ValueError
before anything is called.
"""
import collections
import ctypes

import torch

from . import _lib
from .errors import check

__all__ = ["forward", "backward", "Grads"]

Grads = collections.namedtuple("Grads", "hidden topk_weights gate_up down")

_FLOAT_DTYPES = {torch.float32: 0, torch.bfloat16: 1}  # megamoe_dtype_t FP32, BF16
_ID_DTYPES = {torch.int32: 8, torch.int64: 9}          # INT32, INT64
_INPUTS = ("hidden", "topk_ids", "topk_weights", "gate_up", "down")


def _tensor(name, t, dtypes, shape):
    if not isinstance(t, torch.Tensor):
        raise ValueError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.device.type != "cpu":
        raise ValueError(f"{name} must be on the CPU, got {t.device}")
    if t.dtype not in dtypes:
        raise ValueError(f"{name} has dtype {t.dtype}; use one of {sorted(map(str, dtypes))}")
    if tuple(t.shape) != tuple(shape):
        raise ValueError(f"{name} has shape {tuple(t.shape)}, expected {tuple(shape)}")
    return t.detach().contiguous()


def _prepare(hidden, topk_ids, topk_weights, gate_up, down, ep, swiglu_limit,
             bf16_intermediates=False):
    for name, t in zip(_INPUTS, (hidden, topk_ids, topk_weights, gate_up, down)):
        if not isinstance(t, torch.Tensor):
            raise ValueError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if gate_up.dim() != 3 or down.dim() != 3:
        raise ValueError("gate_up must be [E, H, 2I] and down [E, I, H]")
    e, h, i2 = gate_up.shape
    if i2 % 2:
        raise ValueError(f"gate_up last dim {i2} must be even (gate and up halves)")
    i = i2 // 2
    if topk_ids.dim() != 2:
        raise ValueError(f"topk_ids must be [N, K], got shape {tuple(topk_ids.shape)}")
    n, k = topk_ids.shape
    if hidden.shape[-1:] != (h,) or hidden.numel() != n * h:
        raise ValueError(f"hidden has shape {tuple(hidden.shape)}, expected [{n}, {h}] "
                         "(or [..., H] with N rows)")
    if ep < 1 or n % ep:
        raise ValueError(f"{n} tokens cannot be split over ep={ep} ranks")
    ts = {
        "hidden": _tensor("hidden", hidden.reshape(n, h), _FLOAT_DTYPES, (n, h)),
        "topk_ids": _tensor("topk_ids", topk_ids, _ID_DTYPES, (n, k)),
        "topk_weights": _tensor("topk_weights", topk_weights, _FLOAT_DTYPES, (n, k)),
        "gate_up": _tensor("gate_up", gate_up, _FLOAT_DTYPES, (e, h, 2 * i)),
        "down": _tensor("down", down, _FLOAT_DTYPES, (e, i, h)),
    }
    if ts["gate_up"].dtype != ts["down"].dtype:
        raise ValueError("gate_up and down must have the same dtype")
    shape = _lib.ReferenceShape(ep, n // ep, h, i, e, k)
    params = _lib.default(_lib.ReferenceParams)
    params.swiglu_limit = 0.0 if swiglu_limit is None else float(swiglu_limit)
    params.hidden_dtype = _FLOAT_DTYPES[ts["hidden"].dtype]
    params.ids_dtype = _ID_DTYPES[ts["topk_ids"].dtype]
    params.probs_dtype = _FLOAT_DTYPES[ts["topk_weights"].dtype]
    params.weight_dtype = _FLOAT_DTYPES[ts["gate_up"].dtype]
    params.bf16_intermediates = 1 if bf16_intermediates else 0
    return ts, shape, params


def _ptrs(ts, *names):
    return [ctypes.c_void_p(ts[name].data_ptr()) for name in names]


def forward(hidden, topk_ids, topk_weights, gate_up, down, *, ep=1, swiglu_limit=None,
            bf16_intermediates=False):
    """MoE output (float32, shaped like ``hidden``); ``swiglu_limit`` None or <= 0 is off;
    ``bf16_intermediates`` rounds the intermediates to bf16 where a bf16 implementation stores
    them (include/megamoe/reference.h)."""
    ts, shape, params = _prepare(hidden, topk_ids, topk_weights, gate_up, down, ep, swiglu_limit,
                                 bf16_intermediates)
    out = torch.empty(ts["hidden"].shape, dtype=torch.float32)
    check(_lib.lib.megamoe_reference_forward(ctypes.byref(shape), ctypes.byref(params),
                                             *_ptrs(ts, *_INPUTS),
                                             ctypes.c_void_p(out.data_ptr())))
    return out.reshape(hidden.shape)


def backward(grad_out, hidden, topk_ids, topk_weights, gate_up, down, *, ep=1,
             swiglu_limit=None, bf16_intermediates=False):
    """Gradients (float32) of the forward for ``grad_out`` (shaped like ``hidden``), as
    ``Grads(hidden, topk_weights, gate_up, down)``; options as for ``forward``."""
    ts, shape, params = _prepare(hidden, topk_ids, topk_weights, gate_up, down, ep, swiglu_limit,
                                 bf16_intermediates)
    n, h = ts["hidden"].shape
    if tuple(grad_out.shape) != tuple(hidden.shape):
        raise ValueError(f"grad_out has shape {tuple(grad_out.shape)}, expected "
                         f"{tuple(hidden.shape)}")
    ts["grad_out"] = _tensor("grad_out", grad_out.reshape(n, h), _FLOAT_DTYPES, (n, h))
    params.grad_dtype = _FLOAT_DTYPES[ts["grad_out"].dtype]
    grads = Grads(torch.empty((n, h), dtype=torch.float32),
                  torch.empty(ts["topk_weights"].shape, dtype=torch.float32),
                  torch.empty(ts["gate_up"].shape, dtype=torch.float32),
                  torch.empty(ts["down"].shape, dtype=torch.float32))
    check(_lib.lib.megamoe_reference_backward(
        ctypes.byref(shape), ctypes.byref(params), *_ptrs(ts, "grad_out", *_INPUTS),
        *[ctypes.c_void_p(g.data_ptr()) for g in grads]))
    return grads._replace(hidden=grads.hidden.reshape(hidden.shape))
