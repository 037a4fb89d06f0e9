"""``MegaMoeExperts``: the expert-parallel MoE-FFN layer as a ``torch.nn.Module`` (seed 000).

The layer runs dispatch -> GMM1 -> SwiGLU -> GMM2 -> combine (and the backward) in
libmegamoe over a private symmetric-memory runtime; this module owns the parameters, converts
inputs, and wires the C forward/backward into autograd. See docs/moe.md.

Ranks: the EP group must be the whole world (torch.distributed WORLD when initialised, else
RANK/WORLD_SIZE). Every rank must construct the layer identically and call forward/backward,
``share_execution_resources`` and ``close`` in the same order. The bootstrap endpoint is
``HYPER_PARALLEL_SHMEM_BOOTSTRAP_ENDPOINT`` (same value on every rank; rank 0 listens); when it
is unset the runtime uses ``tcp://127.0.0.1:8662``, which only works for one job per host at a
time — set a free port per job (``megamoe launch`` does this for you).
"""
import ctypes
import math
import os
import weakref

import torch

from . import _lib
from .errors import (INVALID_ARGUMENT, InvalidArgumentTypeError, MegaMoeError, check,
                     clear_next_call_error, fail_next_call)

__all__ = ["MegaMoeExperts"]

_c_int64 = ctypes.c_int64
_vp = ctypes.c_void_p

# megamoe_dtype_t values (include/megamoe/dtype.h)
_FP32, _BF16, _INT32, _INT64 = 0, 1, 8, 9


@_lib.mirror("megamoe_experts_params_t")
class _Params(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_size_t), ("local_num_tokens", _c_int64), ("hidden_size", _c_int64),
                ("intermediate_size", _c_int64), ("num_experts", _c_int64),
                ("top_k", _c_int64), ("expert_capacity_factor", ctypes.c_double),
                ("swiglu_limit", ctypes.c_float), ("schedule", ctypes.c_char_p),
                ("workers", ctypes.c_int), ("cube_workers", ctypes.c_int),
                ("vector_workers", ctypes.c_int), ("dispatch_mode", ctypes.c_char_p),
                ("initial_capacity_factor", ctypes.c_double),
                ("capacity_growth_factor", ctypes.c_double),
                ("replica_slots_per_rank", ctypes.c_int),
                ("max_local_num_tokens", _c_int64)]


@_lib.mirror("megamoe_experts_weights_t")
class _Weights(ctypes.Structure):
    _fields_ = [("gate_up", _vp), ("down", _vp), ("version", ctypes.c_uint64)]


@_lib.mirror("megamoe_experts_input_t")
class _Input(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_size_t), ("hidden_states", _vp), ("topk_ids", _vp), ("topk_ids_dtype", ctypes.c_int),
                ("topk_weights", _vp), ("topk_weights_dtype", ctypes.c_int),
                ("tokens_per_expert", _vp), ("tokens_per_expert_dtype", ctypes.c_int),
                ("num_tokens", _c_int64)]


@_lib.mirror("megamoe_experts_grads_t")
class _Grads(ctypes.Structure):
    _fields_ = [("hidden_states", _vp), ("topk_weights", _vp), ("gate_up", _vp),
                ("down", _vp), ("weight_grad_dtype", ctypes.c_int)]


@_lib.mirror("megamoe_experts_info_t")
class _Info(ctypes.Structure):
    _fields_ = [("tokens", _c_int64), ("hidden", _c_int64), ("intermediate", _c_int64),
                ("num_experts", _c_int64), ("top_k", _c_int64), ("ep", ctypes.c_int),
                ("rank", ctypes.c_int), ("local_experts", _c_int64), ("capacity", _c_int64),
                ("capacity_factor", ctypes.c_double), ("swiglu_limit", ctypes.c_float),
                ("schedule", ctypes.c_char * 8), ("workers", ctypes.c_int),
                ("heap_bytes", ctypes.c_size_t), ("group_layers", ctypes.c_int),
                ("closed", ctypes.c_int), ("last_recv_rows", _c_int64),
                ("cube_workers", ctypes.c_int), ("vector_workers", ctypes.c_int),
                ("dispatch_mode", ctypes.c_char * 8), ("capacity_policy", ctypes.c_char * 8),
                ("initial_capacity_factor", ctypes.c_double),
                ("capacity_growth_factor", ctypes.c_double), ("max_capacity", _c_int64),
                ("growth_events", ctypes.c_int), ("shmem_heap_size", ctypes.c_uint64),
                ("replica_slots", ctypes.c_int), ("last_guests", ctypes.c_int),
                ("last_rows_moved", _c_int64), ("last_max_rows_plain", _c_int64),
                ("last_max_rows", _c_int64), ("max_local_num_tokens", _c_int64),
                ("last_tokens", _c_int64)]


@_lib.mirror("megamoe_experts_replica_t")
class _Replica(ctypes.Structure):
    _fields_ = [("rank", ctypes.c_int), ("slot", ctypes.c_int), ("expert", _c_int64),
                ("home", ctypes.c_int), ("rows", _c_int64)]


@_lib.mirror("megamoe_experts_growth_t")
class _Growth(ctypes.Structure):
    _fields_ = [("forward", ctypes.c_uint64), ("demand", _c_int64), ("rows_before", _c_int64),
                ("rows_after", _c_int64), ("heap_bytes_before", ctypes.c_size_t),
                ("heap_bytes_after", ctypes.c_size_t), ("heap_used_before", ctypes.c_uint64),
                ("heap_used_after", ctypes.c_uint64)]


_MAX_PHASES = 20


@_lib.mirror("megamoe_experts_timing_t")
class _Timing(ctypes.Structure):
    _fields_ = [("count", ctypes.c_int), ("name", ctypes.c_char_p * _MAX_PHASES),
                ("seconds", ctypes.c_double * _MAX_PHASES), ("forwards", ctypes.c_uint64),
                ("backwards", ctypes.c_uint64)]


_L = _lib.lib
_P = ctypes.POINTER
_L.megamoe_experts_create.restype = ctypes.c_int
_L.megamoe_experts_create.argtypes = [_vp, _P(_Params), _P(_vp)]
_L.megamoe_experts_share.restype = ctypes.c_int
_L.megamoe_experts_share.argtypes = [_P(_vp), ctypes.c_size_t]
_L.megamoe_experts_forward.restype = ctypes.c_int
_L.megamoe_experts_forward.argtypes = [_vp, _P(_Weights), _P(_Input), _vp, _P(_vp)]
_L.megamoe_experts_backward.restype = ctypes.c_int
_L.megamoe_experts_backward.argtypes = [_vp, _vp, _P(_Weights), _vp, _P(_Grads)]
_L.megamoe_experts_saved_destroy.restype = None
_L.megamoe_experts_saved_destroy.argtypes = [_vp]
_L.megamoe_experts_close.restype = ctypes.c_int
_L.megamoe_experts_close.argtypes = [_vp]
_L.megamoe_experts_destroy.restype = None
_L.megamoe_experts_destroy.argtypes = [_vp]
_L.megamoe_experts_get_info_sized.restype = ctypes.c_int
_L.megamoe_experts_get_info_sized.argtypes = [_vp, _P(_Info), ctypes.c_size_t]
_L.megamoe_experts_get_growth.restype = ctypes.c_int
_L.megamoe_experts_get_growth.argtypes = [_vp, ctypes.c_int, _P(_Growth)]
_L.megamoe_experts_get_replicas.restype = ctypes.c_int
_L.megamoe_experts_get_replicas.argtypes = [_vp, _P(_Replica), ctypes.c_size_t,
                                            _P(ctypes.c_size_t)]
_L.megamoe_experts_get_timing.restype = ctypes.c_int
_L.megamoe_experts_get_timing.argtypes = [_vp, _P(_Timing)]
_L.megamoe_experts_reset_timing.restype = None
_L.megamoe_experts_reset_timing.argtypes = [_vp]
_L.megamoe_experts_layer_number.restype = ctypes.c_uint64
_L.megamoe_experts_layer_number.argtypes = [_vp]
_L.megamoe_experts_heap_bytes.restype = ctypes.c_size_t
_L.megamoe_experts_heap_bytes.argtypes = [_P(_Params), ctypes.c_int]
_L.megamoe_experts_capacity_rows.restype = _c_int64
_L.megamoe_experts_capacity_rows.argtypes = [_c_int64, _c_int64, _c_int64, ctypes.c_double]


def _ptr(t):
    return ctypes.c_void_p(t.data_ptr()) if t is not None else ctypes.c_void_p(None)


_DEFAULT_FACTOR = 1.25  # push: initial and growth factor when not given (HyperParallel's)

# HyperParallel's replica_transport values (how guest expert weights reach a replica and their
# gradients return). On Ascend they pick between HCCL point-to-point, barrier-based SHMEM,
# signalled SHMEM and SDMA copy engines; on a CPU every one is the same transport: megamoe's
# replicas move through the symmetric heap with put + signal (docs/moe.md "Load balance").
REPLICA_TRANSPORTS = ("p2p", "shmem", "shmem_signal", "shmem_signal_sdma",
                      "shmem_signal_sdma_parallel", "shmem_signal_sdma_bidir")


def _factor(name, value):
    """None, or a finite number >= 1 as float; ValueError otherwise (0 is not 'lossless')."""
    if value is None:
        return None
    ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    try:
        ok = ok and math.isfinite(value) and value >= 1
    except OverflowError:
        ok = False
    if not ok:
        hint = (" (0 is not a capacity: leave it None for the lossless capacity)"
                if name == "expert_capacity_factor" and value == 0 else "")
        raise ValueError(f"{name} must be None or a finite number >= 1, got {value!r}{hint}")
    return float(value)


def _resolve_capacity(expert_capacity_factor, dispatch_mode, initial_capacity_factor,
                      capacity_growth_factor):
    """The two spellings (docs/moe.md "Capacity and dispatch modes"): the seed's
    expert_capacity_factor alone (a fixed receive capacity), or HyperParallel's dispatch_mode
    with initial/growth factors. Returns (C dispatch_mode or None, factor, initial, growth)."""
    if dispatch_mode not in (None, "push", "pull"):
        raise ValueError(f"dispatch_mode must be None, 'push' or 'pull', got {dispatch_mode!r}")
    factor = _factor("expert_capacity_factor", expert_capacity_factor)
    initial = _factor("initial_capacity_factor", initial_capacity_factor)
    growth = _factor("capacity_growth_factor", capacity_growth_factor)
    if factor is not None and (dispatch_mode is not None or initial is not None or
                               growth is not None):
        raise ValueError("expert_capacity_factor (a fixed receive capacity) cannot be combined "
                         "with dispatch_mode / initial_capacity_factor / capacity_growth_factor "
                         "(a growing push capacity or pull); use one spelling")
    if dispatch_mode == "pull":
        if initial is not None or growth is not None:
            raise ValueError("initial_capacity_factor and capacity_growth_factor are only "
                             "supported for dispatch_mode 'push'")
        return "pull", None, None, None
    if dispatch_mode == "push" or initial is not None or growth is not None:
        return ("push", None, _DEFAULT_FACTOR if initial is None else initial,
                _DEFAULT_FACTOR if growth is None else growth)
    return None, factor, None, None


def _token_counts(local_num_tokens, max_local_num_tokens):
    """(fixed T or None, T_cap or None): exactly one of the two, a positive integer."""
    given = [(n, v) for n, v in (("local_num_tokens", local_num_tokens),
                                 ("max_local_num_tokens", max_local_num_tokens)) if v is not None]
    if len(given) != 1:
        raise ValueError("MegaMoeExperts needs exactly one of local_num_tokens (a fixed token "
                         "count per rank, a multiple of 128) and max_local_num_tokens (T_cap: "
                         "each call passes 0..T_cap tokens per rank); got "
                         + (" and ".join(f"{n}={v!r}" for n, v in given) if given else "neither"))
    name, value = given[0]
    ok = isinstance(value, int) and not isinstance(value, bool)
    if not ok and hasattr(value, "__index__") and not isinstance(value, bool):
        value, ok = value.__index__(), True  # numpy / torch integers
    if not ok or value <= 0:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    return (value, None) if name == "local_num_tokens" else (None, value)


def _weights_desc(layer, gate_up, down, external):
    # torch bumps a tensor's version counter on every in-place change (optimizer steps), so
    # (pointer, version) tells the library when to re-pack its private copies. For its own
    # parameters the layer keeps the last tensors it packed from alive: a weight replaced
    # through `.data = ...` or a new Parameter then cannot reuse the old address with an equal
    # version counter. Weights passed per call (expert_weights, e.g. unsharded by FSDP) are
    # not kept alive (that would hold memory the caller frees): a weak reference tells whether
    # the same tensors come again, and other tensors start a new epoch (a re-pack).
    if external:
        last = layer._external_from
        if last is None or last[0]() is not gate_up or last[1]() is not down:
            layer._weights_epoch += 1
        layer._external_from = (weakref.ref(gate_up), weakref.ref(down))
        layer._packed_from = None
    else:
        if layer._external_from is not None:
            layer._external_from = None
            layer._weights_epoch += 1
        layer._packed_from = (gate_up.detach(), down.detach())
    version = ((_version(layer, gate_up, 0) << 32) ^ _version(layer, down, 1)
               ^ (layer._weights_epoch << 56))
    return _Weights(_ptr(gate_up), _ptr(down), version & 0xFFFFFFFFFFFFFFFF)


def _version(layer, t, which):
    """t's version counter; inference tensors have none: for them the identity of the tensor
    stands in (a new tensor is a new version), so in-place changes to inference-tensor weights
    are not seen (docs/moe.md "Weights and re-packing")."""
    if not t.is_inference():
        return t._version
    seen = layer._inference_from[which]
    if seen is None or seen[0]() is not t or seen[1] != t.data_ptr():
        layer._inference_epoch[which] += 1
        layer._inference_from[which] = (weakref.ref(t), t.data_ptr())
    return layer._inference_epoch[which] & 0xFFFFFF


_DOUBLE_BACKWARD = (b"MegaMoeExperts: double backward (create_graph=True through the layer) is "
                    b"not supported: its gradients are computed by libmegamoe outside autograd")


def _refuse_double_backward(grads):
    """backward under create_graph=True: the library's gradients depend on the saved inputs
    and weights, but autograd cannot see how, so they would silently count as constants in a
    second differentiation. torch's @once_differentiable only guards when grad_output requires
    grad; here every gradient gets a node that raises when differentiated."""
    idx = [i for i, g in enumerate(grads) if g is not None]
    err = torch._C._functions.DelayedError(_DOUBLE_BACKWARD, len(idx))
    wrapped = err(*[grads[i].detach().requires_grad_() for i in idx])
    if not isinstance(wrapped, tuple):
        wrapped = (wrapped,)
    out = list(grads)
    for i, g in zip(idx, wrapped):
        out[i] = g
    return tuple(out)


class _MegaMoeFunction(torch.autograd.Function):
    """torch < 2.4: the autograd of the operator pair (megamoe/_experts_ops.py); from 2.4 the
    operator itself is differentiable (register_autograd) and this class is not used."""

    @staticmethod
    def forward(ctx, layer, grad_enabled, external, hidden, topk_ids, topk_weights,
                tokens_per_expert, gate_up, down):
        # (Function.forward runs with grad mode off; needs_input_grad tells what autograd wants,
        # but it ignores an outer torch.no_grad(): grad_enabled is the caller's grad mode, and
        # without it nothing keeps the saved state, so the forward should not make one)
        save = grad_enabled and any(ctx.needs_input_grad[i] for i in (3, 5, 7, 8))
        out, saved = torch.ops.megamoe.experts_forward(layer._op_id, hidden, topk_ids,
                                                       topk_weights, tokens_per_expert, gate_up,
                                                       down, save, external)
        ctx.layer = layer._op_id
        ctx.save_for_backward(saved, topk_weights, gate_up, down)
        return out

    @staticmethod
    def backward(ctx, grad_out):
        saved, probs, gate_up, down = ctx.saved_tensors
        with torch.no_grad():
            g = torch.ops.megamoe.experts_backward(ctx.layer, saved, probs, gate_up, down,
                                                   grad_out)
        grads = (None, None, None, g[0], None, g[1], None, g[2], g[3])
        if torch.is_grad_enabled():
            grads = _refuse_double_backward(grads)
        return grads


class MegaMoeExperts(torch.nn.Module):
    """Experts of an MoE layer, expert-parallel over ``ep_group`` (seed 000).

    Args mirror HyperParallel's ``MegaMoeExperts``: ``local_num_tokens`` (T, a multiple of
    128: every call passes exactly T tokens per rank) or, by keyword, ``max_local_num_tokens``
    (T_cap, any positive integer: each call passes any count 0..T_cap per rank, different on
    every rank and call; buffers and capacity are sized from T_cap; exactly one of the two;
    docs/moe.md "Dynamic tokens"), ``hidden_size`` (H), ``intermediate_size`` (I), ``num_experts`` (E, global, a
    multiple of ``ep_size``), ``top_k`` (K), ``expert_capacity_factor`` (the seed's fixed
    receive capacity: None = lossless align128(EP*T*K); a finite f >= 1 gives
    align128(ceil(T*K*f)) and overflow is an error), or instead HyperParallel's
    ``dispatch_mode`` ("push": the capacity starts at ``initial_capacity_factor`` (default
    1.25) x T*K and every rank grows it together by ``capacity_growth_factor`` (default 1.25)
    when a call needs more; "pull": owners fetch their rows, no receive buffer in the
    symmetric heap; both keep every token; docs/moe.md "Capacity and dispatch modes"),
    ``swiglu_limit`` (None = no clamp), ``ep_size`` / ``ep_group`` (the whole world),
    ``create_parameters`` (False: assign ``gate_up_weight`` [E/EP, H, 2I] and ``down_weight``
    [E/EP, I, H] yourself), ``schedule`` ("O1", the default: one fused launch per direction
    on the multicore executor; "O0": host-scheduled phases), ``workers`` (threads per rank,
    0 = the rank's share of the cores), ``cube_workers`` / ``vector_workers`` (O1 roles,
    0 = derived; docs/multicore.md), ``replica_slots_per_rank`` (hot-expert replicas: R guest
    slots per rank, 0 = off; per call the hottest experts get guest copies on lighter ranks
    and their weight gradients are summed back at home; ``info()["replicas"]`` shows the
    last plan; docs/moe.md "Load balance: hot-expert replicas"), ``replica_transport``
    (HyperParallel's "p2p" (default), "shmem", "shmem_signal", "shmem_signal_sdma",
    "shmem_signal_sdma_parallel" or "shmem_signal_sdma_bidir": Ascend transports for the
    replicas' weights and gradients; on a CPU they are one and the same — puts and signals on
    the symmetric heap — so every value is accepted and behaves identically).
    """

    def __init__(self, local_num_tokens=None, hidden_size=None, intermediate_size=None,
                 num_experts=None, top_k=None, expert_capacity_factor=None, swiglu_limit=None,
                 ep_size=1, ep_group=None, create_parameters=True, schedule="O1", workers=0,
                 cube_workers=0, vector_workers=0, dispatch_mode=None,
                 initial_capacity_factor=None, capacity_growth_factor=None,
                 replica_slots_per_rank=0, replica_transport="p2p", *,
                 max_local_num_tokens=None):
        super().__init__()
        from . import comm as _comm
        self._handle = ctypes.c_void_p(None)
        self._op_id = None  # the layer's id for torch.ops.megamoe.experts_* (_experts_ops.py)
        self._closed = False
        self._inference_from = [None, None]  # inference-tensor weights: identity, not version
        self._inference_epoch = [0, 0]
        self._comm_chain = None
        self._weights_epoch = 0
        self._packed_from = None
        self._external_from = None
        if replica_transport not in REPLICA_TRANSPORTS:
            raise ValueError(f"replica_transport must be one of {', '.join(REPLICA_TRANSPORTS)}, "
                             f"got {replica_transport!r}")
        missing = [n for n, v in (("hidden_size", hidden_size),
                                  ("intermediate_size", intermediate_size),
                                  ("num_experts", num_experts), ("top_k", top_k)) if v is None]
        if missing:
            raise TypeError("MegaMoeExperts() missing required argument(s): " + ", ".join(missing))
        fixed, cap = _token_counts(local_num_tokens, max_local_num_tokens)
        mode, factor, initial, growth = _resolve_capacity(
            expert_capacity_factor, dispatch_mode, initial_capacity_factor,
            capacity_growth_factor)
        p = _lib.default(_Params)
        p.local_num_tokens = fixed or 0
        p.max_local_num_tokens = cap or 0
        p.hidden_size = int(hidden_size)
        p.intermediate_size = int(intermediate_size)
        p.num_experts = int(num_experts)
        p.top_k = int(top_k)
        p.expert_capacity_factor = 0.0 if factor is None else factor  # C: 0 = lossless
        self._mode_bytes = mode.encode() if mode else None
        p.dispatch_mode = self._mode_bytes
        p.initial_capacity_factor = initial or 0.0
        p.capacity_growth_factor = growth or 0.0
        p.swiglu_limit = 0.0 if swiglu_limit is None else float(swiglu_limit)
        self._schedule_bytes = str(schedule).encode()
        p.schedule = self._schedule_bytes
        p.workers = int(workers)
        p.cube_workers = int(cube_workers)
        p.vector_workers = int(vector_workers)
        if isinstance(replica_slots_per_rank, bool) or int(replica_slots_per_rank) != \
                replica_slots_per_rank:
            raise ValueError("replica_slots_per_rank must be an integer, got "
                             f"{replica_slots_per_rank!r}")
        p.replica_slots_per_rank = int(replica_slots_per_rank)
        heap = 0
        if "HYPER_PARALLEL_SHMEM_HEAP_SIZE" not in os.environ:
            # Heap sizing when the variable is unset (docs/moe.md): the runtime starts with the
            # first communicator; give it what this layer's resource group needs (push: up to
            # its growth bound), rounded up with slack, and never less than the 1 GiB default
            # (the heap is sparse: only touched pages cost memory). Ignored when the runtime
            # is already running.
            need = _L.megamoe_experts_heap_bytes(ctypes.byref(p), int(ep_size))
            mib64 = 64 << 20
            heap = max(1 << 30, (need + (16 << 20) + mib64 - 1) // mib64 * mib64)
        # A counted reference on the communicators, released by close(): the last close ends
        # the SHMEM lifecycle and the next layer starts a new one with the settings then in
        # the environment (seed 000 "私有 SHMEM 生命周期").
        self._comm_chain = _comm._acquire(ep_group, heap_size=heap)
        self._comm = self._comm_chain[-1]
        group_size = self._comm.size
        if int(ep_size) != group_size:
            self._release_comm()
            raise ValueError(f"ep_size={ep_size} but the EP group has {group_size} ranks; "
                             "MegaMoeExperts needs EP to cover the whole world")
        self.local_num_tokens = fixed  # None for a layer with per-call counts
        self.max_local_num_tokens = cap  # T_cap of a dynamic layer, else None
        self.hidden_size = int(hidden_size)
        self.intermediate_size = int(intermediate_size)
        self.num_experts = int(num_experts)
        self.top_k = int(top_k)
        self.expert_capacity_factor = factor
        self.dispatch_mode = mode or "push"  # the seed's fixed capacity pushes too
        self.initial_capacity_factor = initial
        self.capacity_growth_factor = growth
        self.swiglu_limit = swiglu_limit
        self.ep_size = int(ep_size)
        self.schedule = schedule
        self.replica_slots_per_rank = int(replica_slots_per_rank)
        self.replica_transport = replica_transport  # every value: one transport on a CPU
        handle = ctypes.c_void_p(None)
        try:
            check(_L.megamoe_experts_create(self._comm.handle, ctypes.byref(p),
                                            ctypes.byref(handle)))
        except MegaMoeError:
            self._release_comm()  # the failure is agreed: every rank releases alike
            raise
        self._handle = handle
        self._op_id = _experts_ops.register_layer(self)

        local = self.num_experts // self.ep_size
        if create_parameters:
            h, i = self.hidden_size, self.intermediate_size
            self.gate_up_weight = torch.nn.Parameter(torch.empty(local, h, 2 * i, device="cpu"))
            self.down_weight = torch.nn.Parameter(torch.empty(local, i, h, device="cpu"))
            self.reset_parameters()
        else:
            self.gate_up_weight = None
            self.down_weight = None

    def reset_parameters(self):
        """Xavier-uniform initialisation of every local expert's weights."""
        with torch.no_grad():
            for e in range(self.gate_up_weight.shape[0]):
                torch.nn.init.xavier_uniform_(self.gate_up_weight[e])
                torch.nn.init.xavier_uniform_(self.down_weight[e])
        self._weights_epoch += 1

    # ---- checks -----------------------------------------------------------------------
    def _check_open(self, what):
        if self._closed or self._op_id is None:  # (plain attributes: torch.compile traces this)
            raise MegaMoeError(-2, f"INVALID_STATE: {what}: MegaMoeExperts used after close()")

    def _weights(self, expert_weights=None):
        if expert_weights is not None:
            if (not isinstance(expert_weights, (tuple, list)) or len(expert_weights) != 2
                    or not all(isinstance(t, torch.Tensor) for t in expert_weights)):
                raise TypeError("expert_weights must be a (gate_up_weight, down_weight) pair of "
                                "tensors")
            gu, dn = expert_weights
        else:
            gu, dn = self.gate_up_weight, self.down_weight
        if gu is None or dn is None:
            raise ValueError("MegaMoeExperts has no parameters (create_parameters=False): pass "
                             "expert_weights=(gate_up [E/EP, H, 2I], down [E/EP, I, H]) to "
                             "forward, or assign gate_up_weight and down_weight")
        local, h, i = self.num_experts // self.ep_size, self.hidden_size, self.intermediate_size
        for name, t, shape in (("gate_up_weight", gu, (local, h, 2 * i)),
                               ("down_weight", dn, (local, i, h))):
            if tuple(t.shape) != shape:
                raise ValueError(f"{name} has shape {tuple(t.shape)}, expected {shape}")
            if t.dtype != torch.bfloat16 or t.device.type != "cpu":
                raise ValueError(f"{name} is {t.dtype} on {t.device}; MegaMoeExperts runs in "
                                 "bfloat16 on the CPU: call .to(device='cpu', "
                                 "dtype=torch.bfloat16)")
            if not t.is_contiguous():
                raise ValueError(f"{name} must be contiguous")
        return gu, dn

    def forward(self, hidden_states, topk_ids, topk_weights, tokens_per_expert=None, *,
                expert_weights=None):
        """Output of ``hidden_states`` ([..., H] flattening to T rows, bfloat16) through the
        experts ``topk_ids`` ([T, K] global ids) chose, weighted by ``topk_weights`` ([T, K]);
        ``tokens_per_expert`` ([E]) is the optional exact local histogram. Collective: every EP
        rank calls it, in the same order as its other collective calls. Errors raise
        MegaMoeError on every rank before data moves, and the layer stays usable: a bad tensor
        on any rank (dtype, shape, device, contiguity: InvalidArgumentError, also a
        ValueError), ids outside [0, E), capacity overflow, NaN/Inf in hidden_states,
        topk_weights or (in backward) the output gradient (``MEGAMOE_CHECK_FINITE=0`` lets
        those through), and calls made in a different order on another rank
        (CallMismatchError, naming what each rank called).

        ``expert_weights`` (keyword only, HyperParallel's spelling): this call's
        ``(gate_up [E/EP, H, 2I], down [E/EP, I, H])`` instead of the layer's parameters, e.g.
        weights an outer module owns and unshards per step (FSDP; with
        ``create_parameters=False``). Gradients flow to them; the layer keeps no reference to
        them after the backward, and other tensors than the last call's are re-packed."""
        self._check_open("forward")
        try:
            args = self._forward_args(hidden_states, topk_ids, topk_weights, tokens_per_expert,
                                      expert_weights)
        except MegaMoeError:
            raise
        except (TypeError, ValueError) as exc:  # this rank only: every rank raises it
            self._refuse("forward", exc)
        shape, x, ids, probs, tpe, gate_up, down = args
        if _experts_ops.DIFFERENTIABLE:  # torch >= 2.4: the operator pair, torch.compile-able
            save = torch.is_grad_enabled() and (x.requires_grad or probs.requires_grad
                                                or gate_up.requires_grad or down.requires_grad)
            out = torch.ops.megamoe.experts_forward(self._op_id, x, ids, probs, tpe, gate_up,
                                                    down, save, expert_weights is not None)[0]
        else:
            out = _MegaMoeFunction.apply(self, torch.is_grad_enabled(),
                                         expert_weights is not None, x, ids, probs, tpe, gate_up,
                                         down)
        return out.reshape(shape)

    def _refuse(self, call, exc):
        """Raise exc's error on every rank: this rank takes part in the collective call it
        refuses (its first exchange), so the peers fail with the same error at once."""
        status = getattr(exc, "status", -1)
        fail_next_call(str(exc), status)
        try:
            if call == "forward":
                st = _L.megamoe_experts_forward(self._handle, None, None, None, None)
            else:
                st = _L.megamoe_experts_backward(self._handle, None, None, None, None)
        finally:
            clear_next_call_error()  # not consumed when the layer refused before its exchange
        if st == INVALID_ARGUMENT and isinstance(exc, TypeError):
            raise InvalidArgumentTypeError(st) from exc  # also the TypeError it was here
        if st < 0:
            raise MegaMoeError(st) from exc
        raise exc  # pragma: no cover - the library always reports the error

    def _forward_args(self, hidden_states, topk_ids, topk_weights, tokens_per_expert,
                      expert_weights=None):
        for name, t in (("hidden_states", hidden_states), ("topk_ids", topk_ids),
                        ("topk_weights", topk_weights)):
            if not isinstance(t, torch.Tensor):
                raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        gate_up, down = self._weights(expert_weights)
        t, h, k, e = self.local_num_tokens, self.hidden_size, self.top_k, self.num_experts
        shape = hidden_states.shape
        if t is None:  # per-call counts: any number of rows (T_cap is checked collectively)
            if hidden_states.dim() < 1 or shape[-1] != h:
                raise ValueError(f"hidden_states has shape {tuple(shape)}; it must be [..., "
                                 f"H={h}] (any number of rows up to max_local_num_tokens = "
                                 f"{self.max_local_num_tokens})")
            t = hidden_states.numel() // h
            for name, other in (("topk_ids", topk_ids), ("topk_weights", topk_weights)):
                if other.dim() != 2 or other.shape[0] != t:
                    raise ValueError(f"hidden_states has {t} rows but {name} has shape "
                                     f"{tuple(other.shape)}; pass [{t}, K={k}] (one row per "
                                     "token)")
        elif shape[-1] != h or hidden_states.numel() != t * h:
            raise ValueError(f"hidden_states has shape {tuple(shape)}; it must flatten to "
                             f"[T={t}, H={h}]")
        if hidden_states.dtype != torch.bfloat16:
            raise ValueError(f"hidden_states is {hidden_states.dtype}; MegaMoeExperts runs in "
                             "bfloat16")
        if hidden_states.device.type != "cpu":
            raise ValueError(f"hidden_states is on {hidden_states.device}; use the CPU")
        x = hidden_states.reshape(t, h).contiguous()
        if tuple(topk_ids.shape) != (t, k) or topk_ids.dtype not in (torch.int32, torch.int64):
            raise ValueError(f"topk_ids must be int32/int64 [{t}, {k}], got {topk_ids.dtype} "
                             f"{tuple(topk_ids.shape)}")
        if tuple(topk_weights.shape) != (t, k) or topk_weights.dtype not in (torch.float32,
                                                                            torch.bfloat16):
            raise ValueError(f"topk_weights must be float32/bfloat16 [{t}, {k}], got "
                             f"{topk_weights.dtype} {tuple(topk_weights.shape)}")
        ids = topk_ids.contiguous()
        probs = topk_weights.contiguous()
        tpe = None
        if tokens_per_expert is not None:
            if (not isinstance(tokens_per_expert, torch.Tensor) or tokens_per_expert.dim() != 1
                    or tokens_per_expert.shape[0] != e
                    or tokens_per_expert.dtype not in (torch.int32, torch.int64)
                    or tokens_per_expert.device.type != "cpu"):
                got = (f"{tokens_per_expert.dtype} {tuple(tokens_per_expert.shape)} on "
                       f"{tokens_per_expert.device}"
                       if isinstance(tokens_per_expert, torch.Tensor)
                       else type(tokens_per_expert).__name__)
                raise ValueError(f"tokens_per_expert must be the [E={e}] int32/int64 CPU "
                                 f"histogram of topk_ids (one dimension), got {got}")
            # the layer routes by it instead of counting the ids again (int32 or int64, as is)
            tpe = tokens_per_expert.contiguous()
        return shape, x, ids, probs, tpe, gate_up, down

    # ---- resources ----------------------------------------------------------------------
    @staticmethod
    def share_execution_resources(layers):
        """Let serial layers of the same configuration share one workspace (call before the
        first forward, on every rank with the same layers). Parameters, gradients and saved
        activations stay per layer."""
        layers = list(layers)
        if not layers:
            raise ValueError("share_execution_resources needs at least one layer")
        valid = [l for l in layers if isinstance(l, MegaMoeExperts) and l._handle]
        for l in valid:
            l._check_open("share_execution_resources")
        for l in layers:
            if not isinstance(l, MegaMoeExperts):
                if not valid:
                    raise TypeError(f"share_execution_resources got {type(l).__name__}")
                # this rank only: its peers are in the call, so every rank raises it
                fail_next_call(f"share_execution_resources got {type(l).__name__}, not a "
                               "MegaMoeExperts layer")
                break
        arr = (ctypes.c_void_p * len(valid))(*[l._handle.value for l in valid])
        try:
            check(_L.megamoe_experts_share(arr, len(valid)))
        finally:
            clear_next_call_error()

    def close(self):
        """Release this layer's execution resources (idempotent). Collective: call it on every
        rank in the same order as the other collective calls, after all backward passes and
        before destroying the process group; a peer making another call meanwhile is a
        CallMismatchError on both ranks, and the layer stays open (close it again in step)."""
        if self._closed:
            return
        if self._handle:
            check(_L.megamoe_experts_close(self._handle))
        self._closed = True
        self._packed_from = None
        self._release_comm()

    def _release_comm(self):
        chain, self._comm_chain = self._comm_chain, None
        if chain:
            from . import comm as _comm
            _comm._release(chain)

    def __del__(self):
        try:
            if getattr(self, "_handle", None):
                _L.megamoe_experts_destroy(self._handle)
                self._handle = ctypes.c_void_p(None)
        except Exception:  # pragma: no cover - interpreter shutdown
            pass

    # ---- introspection -----------------------------------------------------------------
    def info(self):
        """Dict of the resolved configuration (capacity rows, workers, heap bytes, ...)."""
        if not self._handle:
            raise MegaMoeError(-2, "INVALID_STATE: layer destroyed")
        i = _Info()
        check(_L.megamoe_experts_get_info_sized(self._handle, ctypes.byref(i), ctypes.sizeof(i)))
        d = {f: getattr(i, f) for f, _ in _Info._fields_}
        for f in ("schedule", "dispatch_mode", "capacity_policy"):
            d[f] = getattr(i, f).decode()
        growth = []
        for k in range(i.growth_events):
            g = _Growth()
            check(_L.megamoe_experts_get_growth(self._handle, k, ctypes.byref(g)))
            growth.append({f: getattr(g, f) for f, _ in _Growth._fields_})
        d["growth"] = growth  # one dict per growth of the receive capacity, oldest first
        d["replicas"] = self._replicas()  # the last forward's guest slots (replicas)
        return d

    def _replicas(self):
        n = ctypes.c_size_t(0)
        check(_L.megamoe_experts_get_replicas(self._handle, None, 0, ctypes.byref(n)))
        arr = (_Replica * max(1, n.value))()
        check(_L.megamoe_experts_get_replicas(self._handle, arr, n.value, ctypes.byref(n)))
        return [{f: getattr(arr[k], f) for f, _ in _Replica._fields_} for k in range(n.value)]

    @property
    def layer_number(self):
        """N of "layer #N" in CALL_MISMATCH messages: layers are numbered in creation order,
        the same on every rank."""
        return int(_L.megamoe_experts_layer_number(self._handle)) if self._handle else 0

    def timing(self, reset=False):
        """Per-phase seconds accumulated on this rank ({"fwd.gmm1": s, ...})."""
        t = _Timing()
        check(_L.megamoe_experts_get_timing(self._handle, ctypes.byref(t)))
        d = {t.name[i].decode(): t.seconds[i] for i in range(t.count)}
        d["forwards"], d["backwards"] = t.forwards, t.backwards
        if reset:
            _L.megamoe_experts_reset_timing(self._handle)
        return d

    @staticmethod
    def capacity_rows(ep, tokens, top_k, expert_capacity_factor=None):
        """Receive rows of the seed's fixed capacity (None: lossless)."""
        f = _factor("expert_capacity_factor", expert_capacity_factor)
        return int(_L.megamoe_experts_capacity_rows(ep, tokens, top_k, f or 0.0))

    def extra_repr(self):
        tokens = (f"T={self.local_num_tokens}" if self.local_num_tokens is not None
                  else f"max_local_num_tokens={self.max_local_num_tokens}")
        return (f"{tokens}, H={self.hidden_size}, I={self.intermediate_size}, "
                f"E={self.num_experts}, K={self.top_k}, ep_size={self.ep_size}, "
                f"expert_capacity_factor={self.expert_capacity_factor}, "
                f"dispatch_mode={self.dispatch_mode!r}, "
                f"initial_capacity_factor={self.initial_capacity_factor}, "
                f"capacity_growth_factor={self.capacity_growth_factor}, "
                f"swiglu_limit={self.swiglu_limit}, schedule={self.schedule!r}, "
                f"replica_slots_per_rank={self.replica_slots_per_rank}, "
                f"replica_transport={self.replica_transport!r}")


from . import _experts_ops  # noqa: E402  torch.ops.megamoe.experts_forward / experts_backward
from ._experts_ops import _Saved  # noqa: E402,F401  one forward's saved state
