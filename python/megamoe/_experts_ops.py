"""MegaMoeExperts' compute as a functional operator pair: ``torch.ops.megamoe.experts_forward`` /
``experts_backward`` (megamoe/_library.py), differentiable through ``register_autograd`` on torch
>= 2.4, so ``torch.compile(model, fullgraph=True)`` traces a model with the layer; on older torch
megamoe.experts' autograd.Function calls the same two operators.

No raw pointer crosses the operator boundary:

* the layer is an ``int`` id into a registry of live layers (ids are never reused; a closed or
  collected layer is an error naming it);
* a forward's saved state travels as a one-element int64 tensor whose storage is owned by the
  state: the library's state lives exactly as long as that tensor (held by the autograd graph,
  or a compiled graph's saved activations) and is freed with it. The tensor holds the state's
  id (never reused), which the backward looks up among the live states: a copy of the tensor
  finds the state while the original lives, and an id whose state is gone is an error, never a
  stale pointer. The gradient buffers are allocated here from what the forward recorded
  (shapes, the topk_weights dtype), never taken from the caller. The backward leaves the state
  alone, so ``retain_graph=True`` works.

Both operators are collective (ordered side effects: no compiler pass drops or reorders them).
"""
import ctypes
import itertools
import weakref

import torch

from . import _lib
from . import experts as _ex
from . import profiler as _profiler
from ._library import megamoe as _megamoe
from .errors import INVALID_ARGUMENT, MegaMoeError, check

_L = _lib.lib
_layers = {}                 # id -> weakref to a MegaMoeExperts
_ids = itertools.count(1)
_saved_states = {}           # id -> weakref to a live _Saved
_saved_ids = itertools.count(1)


def register_layer(layer):
    """A fresh id for ``layer`` (the ``int layer`` of the operators)."""
    n = next(_ids)
    _layers[n] = weakref.ref(layer, lambda _, n=n: _layers.pop(n, None))
    return n


def layer_of(layer_id, what):
    ref = _layers.get(layer_id)
    layer = ref() if ref is not None else None
    if layer is None or layer._closed or not layer._handle:
        raise MegaMoeError(INVALID_ARGUMENT, f"{what}: layer id {layer_id} is not an open "
                           "MegaMoeExperts layer of this process (closed, collected, or never "
                           "made)")
    return layer


class _Saved(ctypes.Structure):
    """One forward's saved state. Its bytes (its id) are the saved tensor's storage
    (torch.frombuffer), so the library's state is freed when the last tensor using it goes."""
    _fields_ = [("id", ctypes.c_int64)]

    def __init__(self):
        super().__init__(next(_saved_ids))
        self.handle = ctypes.c_void_p(None)
        _saved_states[self.id] = weakref.ref(self)

    def free(self):
        if getattr(self, "handle", None):
            _L.megamoe_experts_saved_destroy(self.handle)
            self.handle = ctypes.c_void_p(None)
        _saved_states.pop(self.id, None)

    def __del__(self):
        try:
            self.free()
        except Exception:  # pragma: no cover - interpreter shutdown
            pass


def _require(t, name, dtypes, numel):
    """What memory safety needs before a pointer goes to the library (the layer checked the
    user's arguments already; the operator can also be called directly)."""
    if not isinstance(t, torch.Tensor) or t.device.type != "cpu" or not t.is_contiguous():
        raise ValueError(f"{name} must be a contiguous CPU tensor")
    if t.dtype not in dtypes:
        raise ValueError(f"{name} has dtype {t.dtype}, which the layer does not take")
    if t.numel() != numel:
        raise ValueError(f"{name} has {t.numel()} elements, the layer needs {numel}")


def _ptr(t):
    return ctypes.c_void_p(t.data_ptr()) if t is not None else ctypes.c_void_p(None)


_FORWARD = ("experts_forward(int layer, Tensor hidden_states, Tensor topk_ids, "
            "Tensor topk_weights, Tensor? tokens_per_expert, Tensor gate_up, Tensor down, "
            "bool save, bool external) -> (Tensor, Tensor)")
_BACKWARD = ("experts_backward(int layer, Tensor saved, Tensor topk_weights, Tensor gate_up, "
             "Tensor down, Tensor grad_output) -> (Tensor, Tensor, Tensor, Tensor)")


def _forward_fake(layer, hidden_states, topk_ids, topk_weights, tokens_per_expert, gate_up,
                  down, save, external):
    return (torch.empty_like(hidden_states, memory_format=torch.contiguous_format),
            hidden_states.new_empty(1, dtype=torch.int64))


@_megamoe.define(_FORWARD, fake=_forward_fake, collective=True)
def experts_forward(layer, hidden_states, topk_ids, topk_weights, tokens_per_expert, gate_up,
                    down, save, external):
    """Output [T, H] bf16 and the saved-state tensor (int64 [1]; a plain zero when not save)."""
    m = layer_of(layer, "experts_forward")
    t, h, k, e = m.local_num_tokens, m.hidden_size, m.top_k, m.num_experts
    local = e // m.ep_size
    dynamic = t is None  # per-call counts: this call's rows (0..T_cap, checked collectively)
    if dynamic:
        t = hidden_states.numel() // h if isinstance(hidden_states, torch.Tensor) else 0
    try:
        _require(hidden_states, "hidden_states", (torch.bfloat16,), t * h)
        _require(topk_ids, "topk_ids", (torch.int32, torch.int64), t * k)
        _require(topk_weights, "topk_weights", (torch.float32, torch.bfloat16), t * k)
        _require(gate_up, "gate_up", (torch.bfloat16,), local * h * 2 * m.intermediate_size)
        _require(down, "down", (torch.bfloat16,), local * m.intermediate_size * h)
        if tokens_per_expert is not None:
            _require(tokens_per_expert, "tokens_per_expert", (torch.int32, torch.int64), e)
    except ValueError as exc:  # this rank only: every rank raises it
        m._refuse("forward", exc)
    out = torch.empty(hidden_states.shape, dtype=torch.bfloat16, device="cpu")
    tpe_int64 = tokens_per_expert is not None and tokens_per_expert.dtype == torch.int64
    inp = _lib.default(_ex._Input)  # an extensible struct: fields by name
    inp.hidden_states = _ptr(hidden_states)
    inp.topk_ids = _ptr(topk_ids)
    inp.topk_ids_dtype = _ex._INT32 if topk_ids.dtype == torch.int32 else _ex._INT64
    inp.topk_weights = _ptr(topk_weights)
    inp.topk_weights_dtype = _ex._FP32 if topk_weights.dtype == torch.float32 else _ex._BF16
    inp.tokens_per_expert = _ptr(tokens_per_expert)
    inp.tokens_per_expert_dtype = _ex._INT64 if tpe_int64 else _ex._INT32
    if dynamic:
        inp.num_tokens = t  # 0..T_cap (a fixed layer keeps the default 0: its T)
    w = _ex._weights_desc(m, gate_up, down, external)
    if save:
        state = _Saved()
        check(_L.megamoe_experts_forward(m._handle, ctypes.byref(w), ctypes.byref(inp),
                                         _ptr(out), ctypes.byref(state.handle)))
        state.layer = weakref.ref(m)
        state.version = w.version
        state.topk_dtype = topk_weights.dtype
        state.shapes = (tuple(hidden_states.shape), tuple(topk_weights.shape),
                        tuple(gate_up.shape), tuple(down.shape))
        saved = torch.frombuffer(state, dtype=torch.int64)
    else:
        check(_L.megamoe_experts_forward(m._handle, ctypes.byref(w), ctypes.byref(inp),
                                         _ptr(out), None))
        saved = torch.zeros(1, dtype=torch.int64, device="cpu")
    _profiler._note_invocation()  # an active mega_kernel_profile counts its launches
    return out, saved


def _backward_fake(layer, saved, topk_weights, gate_up, down, grad_output):
    return (torch.empty_like(grad_output, dtype=torch.bfloat16,
                             memory_format=torch.contiguous_format),
            torch.empty_like(topk_weights, memory_format=torch.contiguous_format),
            torch.empty_like(gate_up, memory_format=torch.contiguous_format),
            torch.empty_like(down, memory_format=torch.contiguous_format))


_GONE = ("MegaMoeExperts backward: the forward's saved state is gone (its saved tensor was freed, "
         "or the forward ran without save / under torch.no_grad())")


@_megamoe.define(_BACKWARD, fake=_backward_fake, collective=True)
def experts_backward(layer, saved, topk_weights, gate_up, down, grad_output):
    """Gradients (hidden_states, topk_weights, gate_up, down) of the forward that returned
    ``saved`` (the state stays: a second backward gives the same gradients)."""
    m = layer_of(layer, "experts_backward")
    ref = None
    if (isinstance(saved, torch.Tensor) and saved.dtype == torch.int64 and saved.numel() == 1
            and saved.device.type == "cpu"):
        ref = _saved_states.get(int(saved.reshape(-1)[0]))
    state = ref() if ref is not None else None
    if state is None or not state.handle or state.layer() is not m:
        # one rank only (e.g. a second backward there): the peers are in their backward
        m._refuse("backward", MegaMoeError(-2, _GONE))
    x_shape, tk_shape, gu_shape, dn_shape = state.shapes
    try:
        if (tuple(topk_weights.shape) != tk_shape or topk_weights.dtype != state.topk_dtype
                or tuple(gate_up.shape) != gu_shape or tuple(down.shape) != dn_shape):
            raise ValueError("experts_backward: topk_weights / weights differ from the "
                             f"forward's (topk_weights {topk_weights.dtype} "
                             f"{tuple(topk_weights.shape)}, expected {state.topk_dtype} "
                             f"{tk_shape})")
        _require(gate_up, "gate_up", (torch.bfloat16,), gate_up.numel())
        _require(down, "down", (torch.bfloat16,), down.numel())
        if grad_output.numel() != x_shape[0] * x_shape[1]:
            raise ValueError(f"experts_backward: grad_output has {grad_output.numel()} "
                             f"elements, the forward's output {x_shape[0] * x_shape[1]}")
    except ValueError as exc:  # this rank only: every rank raises it
        m._refuse("backward", exc)
    grad_output = grad_output.to(device="cpu", dtype=torch.bfloat16).contiguous()
    g_hidden = torch.empty(x_shape, dtype=torch.bfloat16, device="cpu")
    g_topk = torch.empty(tk_shape, dtype=state.topk_dtype, device="cpu")
    g_gate_up = torch.empty(gu_shape, dtype=torch.bfloat16, device="cpu")
    g_down = torch.empty(dn_shape, dtype=torch.bfloat16, device="cpu")
    grads = _ex._Grads(_ptr(g_hidden), _ptr(g_topk), _ptr(g_gate_up), _ptr(g_down), _ex._BF16)
    w = _ex._Weights(_ptr(gate_up), _ptr(down), state.version)
    check(_L.megamoe_experts_backward(m._handle, state.handle, ctypes.byref(w),
                                      _ptr(grad_output), ctypes.byref(grads)))
    _profiler._note_invocation()
    return g_hidden, g_topk, g_gate_up, g_down


# ---- autograd (torch >= 2.4; megamoe.experts' autograd.Function below that) ------------------

def _setup_context(ctx, inputs, output):
    layer, hidden, ids, probs, tpe, gate_up, down, save, external = inputs
    ctx.layer = layer
    ctx.save_for_backward(output[1], probs, gate_up, down)


def _backward(ctx, grad_out, _grad_saved):
    saved, probs, gate_up, down = ctx.saved_tensors
    with torch.no_grad():
        g = torch.ops.megamoe.experts_backward(ctx.layer, saved, probs, gate_up, down, grad_out)
    grads = (None, g[0], None, g[1], None, g[2], g[3], None, None)
    if torch.is_grad_enabled():
        grads = _ex._refuse_double_backward(grads)
    return grads


DIFFERENTIABLE = _megamoe.register_autograd("experts_forward", _backward,
                                            setup_context=_setup_context)
