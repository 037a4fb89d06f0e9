"""The serving MegaMoE: CANN's ``get_symm_buffer_for_mega_moe`` and ``mega_moe`` on CPUs.

Same names, argument order, keywords, defaults and return tuple as CANN's
``cann_ops_transformer.ops`` (re-exported there, and by ``megamoe.ops``), so vLLM-Ascend,
cann-recipes-infer (Kimi-K3) and DeepEP-Ascend run unchanged::

    buf = megamoe.ops.get_symm_buffer_for_mega_moe(ep_group, num_experts, max_tokens, top_k,
                                                   hidden=H, intermediate_hidden=2 * I)
    y, expert_token_nums = megamoe.ops.mega_moe(x, topk_ids, topk_weights, w13_list, w2_list, buf)

One call: dispatch -> GMM1 -> gated activation -> GMM2 -> weighted combine (+ shared experts on
the caller's own tokens) over the buffer's expert-parallel group, forward only. Semantics,
scenes (bf16, int8, int4, the MX fp8/fp4 scenes), errors: docs/serve.md. Every argument error of
any rank raises on every rank of the call before data moves (``ValueError``/``TypeError`` on the
rank that passed it, :class:`megamoe.errors.InvalidArgumentError` — a ``ValueError`` — naming
that rank on the others), and the buffer stays usable.
"""
import ctypes
import json
import math
import numbers
import os
import weakref

import numpy as np
import torch

from . import _lib
from ._library import megamoe as _megamoe
from . import comm as _comm
from ._dtypes import Float8Dtype  # torch 1.13 fp8 tokens (megamoe/_dtypes.py)
from .errors import (CALL_MISMATCH, INVALID_ARGUMENT, InvalidArgumentError,
                     InvalidArgumentTypeError, MegaMoeError, check, clear_next_call_error,
                     fail_next_call)

__all__ = ["SymmBuffer", "get_symm_buffer_for_mega_moe", "mega_moe", "float4_e2m1fn_x2",
           "weight_cache_info", "clear_weight_cache"]

float4_e2m1fn_x2 = 296  # torch_npu's enum value of the packed fp4 dtype

# megamoe_dtype_t (include/megamoe/dtype.h)
_FP32, _BF16, _FP16, _E4M3, _E5M2, _E8M0, _INT8, _UINT8, _INT32, _INT64, _BOOL = range(11)
_INVALID_DTYPE = 99
_FROM_TORCH = {torch.float32: _FP32, torch.bfloat16: _BF16, torch.float16: _FP16,
               torch.int8: _INT8, torch.uint8: _UINT8, torch.int32: _INT32, torch.int64: _INT64,
               torch.bool: _BOOL}
for _name, _code in (("float8_e4m3fn", _E4M3), ("float8_e5m2", _E5M2), ("uint64", _INT64),
                     ("float8_e8m0fnu", _E8M0)):
    if hasattr(torch, _name):  # torch 2.x
        _FROM_TORCH[getattr(torch, _name)] = _code

# megamoe_serve_type_t (include/megamoe/serve.h)
T_NONE, T_BF16, T_INT8, T_INT4, T_E4M3, T_E5M2, T_FP4 = range(7)
_T_INVALID = 99
_TYPE_NAMES = {T_NONE: "None", T_BF16: "bfloat16", T_INT8: "int8", T_INT4: "int4",
               T_E4M3: "float8_e4m3fn", T_E5M2: "float8_e5m2", T_FP4: "float4_e2m1fn_x2"}
# integer spellings callers use: torch ScalarType (1 int8, 15 bf16, 23/24 fp8), ge DataType
# (2 int8, 27 bf16, 29 int4), torch_npu enums (258 int8, 285 int4, 296 fp4)
_INT_TYPES = {1: T_INT8, 2: T_INT8, 258: T_INT8, 29: T_INT4, 285: T_INT4, 23: T_E5M2,
              24: T_E4M3, 296: T_FP4, 15: T_BF16, 27: T_BF16}


def _serve_type(value, what):
    """A dtype spelling -> (megamoe_serve_type_t, None) or (_T_INVALID, (kind, message))."""
    if value is None:
        return T_NONE, None
    if isinstance(value, bool):
        return _T_INVALID, (TypeError, f"{what} must be None, a torch.dtype or an int, not bool")
    if isinstance(value, Float8Dtype):
        return (T_E4M3 if value.megamoe_code == _E4M3 else T_E5M2), None
    if isinstance(value, torch.dtype):
        names = {torch.int8: T_INT8, torch.bfloat16: T_BF16}
        for n, t in (("float8_e4m3fn", T_E4M3), ("float8_e5m2", T_E5M2)):
            if hasattr(torch, n):
                names[getattr(torch, n)] = t
        if value in names:
            return names[value], None
        return _T_INVALID, (ValueError, f"{what} = {value} is not supported (int8, float8_e4m3fn, "
                                        f"float8_e5m2, float4_e2m1fn_x2 = 296, or None)")
    if isinstance(value, numbers.Integral):
        if int(value) in _INT_TYPES:
            return _INT_TYPES[int(value)], None
        return _T_INVALID, (ValueError, f"{what} = {int(value)} is not a supported type code "
                                        f"(int8: 1, 2, 258; int4: 29, 285; fp8: 23, 24; fp4: 296)")
    return _T_INVALID, (TypeError, f"{what} must be None, a torch.dtype or an int, got "
                                   f"{type(value).__name__}")


# ---- C mirrors ---------------------------------------------------------------------------

@_lib.mirror("megamoe_tensor_t")
class _Tensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("dtype", ctypes.c_int), ("ndim", ctypes.c_int),
                ("shape", ctypes.c_int64 * 4)]


@_lib.mirror("megamoe_tensor_list_t")
class _List(ctypes.Structure):
    _fields_ = [("count", ctypes.c_int64), ("items", ctypes.POINTER(_Tensor))]


_I64 = ctypes.c_int64


@_lib.mirror("megamoe_symm_buffer_params_t")
class _Params(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_size_t), ("num_experts", _I64), ("num_max_tokens_per_rank", _I64), ("num_topk", _I64),
                ("hidden", _I64), ("intermediate_hidden", _I64), ("max_recv_token_num", _I64),
                ("dispatch_quant_mode", _I64), ("dispatch_quant_out_dtype", ctypes.c_int),
                ("combine_quant_mode", _I64), ("comm_alg", ctypes.c_char_p),
                ("combine_comm_mode", _I64), ("topk_weights_type", _I64)]


@_lib.mirror("megamoe_symm_buffer_info_t")
class _Info(ctypes.Structure):
    _fields_ = [("rank", ctypes.c_int), ("world_size", ctypes.c_int),
                ("ranks_per_host", ctypes.c_int), ("alive", ctypes.c_int), ("params", _Params),
                ("local_experts", _I64), ("max_recv_rows", _I64),
                ("symmetric_bytes", ctypes.c_size_t), ("local_bytes", ctypes.c_size_t),
                ("calls", ctypes.c_uint64), ("last_recv_rows", _I64), ("id", ctypes.c_uint64),
                ("o1_calls", ctypes.c_uint64)]


_T = _Tensor
_Lst = _List
_D = ctypes.c_double
_Ci = ctypes.c_int


@_lib.mirror("megamoe_mega_moe_args_t")
class _Args(ctypes.Structure):
    _fields_ = ([("struct_size", ctypes.c_size_t), ("x", _T), ("topk_ids", _T), ("topk_weights", _T)]
                + [(n, _Lst) for n in ("l1_weights", "l2_weights", "l1_weights_sf",
                                       "l2_weights_sf", "l1_bias", "l2_bias")]
                + [("x_active_mask", _T), ("scales", _T), ("activation", ctypes.c_char_p),
                   ("activation_clamp", _D), ("activation_params_set", _Ci), ("alpha", _D),
                   ("beta", _D), ("linear_beta", _D), ("weight1_type", _Ci),
                   ("weight2_type", _Ci)]
                + [(n, _Lst) for n in ("shared_l1_weights", "shared_l2_weights",
                                       "shared_l1_weights_sf", "shared_l2_weights_sf",
                                       "shared_l1_bias", "shared_l2_bias")]
                + [("shared_expert_quant_out_dtype", _Ci), ("shared_weight1_type", _Ci),
                   ("shared_weight2_type", _Ci), ("y", _T), ("expert_token_nums", _T),
                   ("weights_version", ctypes.c_uint64)])


_L = _lib.lib
_vp = ctypes.c_void_p
_P = ctypes.POINTER
_L.megamoe_symm_buffer_create.restype = ctypes.c_int
_L.megamoe_symm_buffer_create.argtypes = [_vp, _P(_Params), _P(_vp)]
_L.megamoe_symm_buffer_destroy.restype = ctypes.c_int
_L.megamoe_symm_buffer_destroy.argtypes = [_vp]
_L.megamoe_symm_buffer_free.restype = None
_L.megamoe_symm_buffer_free.argtypes = [_vp]
_L.megamoe_symm_buffer_set_quant.restype = ctypes.c_int
_L.megamoe_symm_buffer_set_quant.argtypes = [_vp, ctypes.c_int64, ctypes.c_int]
_L.megamoe_symm_buffer_update_group.restype = ctypes.c_int
_L.megamoe_symm_buffer_update_group.argtypes = [_vp, _vp]
_L.megamoe_symm_buffer_get_info_sized.restype = ctypes.c_int
_L.megamoe_symm_buffer_get_info_sized.argtypes = [_vp, _P(_Info), ctypes.c_size_t]
_L.megamoe_symm_buffer_local.restype = ctypes.c_int
_L.megamoe_symm_buffer_local.argtypes = [_vp, _P(_vp), _P(ctypes.c_size_t)]
_L.megamoe_symm_buffer_mask.restype = ctypes.c_int
_L.megamoe_symm_buffer_mask.argtypes = [_vp, _P(_P(ctypes.c_int32))]
_L.megamoe_symm_buffer_mask_set.restype = ctypes.c_int
_L.megamoe_symm_buffer_mask_set.argtypes = [_vp, ctypes.c_int, ctypes.c_int]
_L.megamoe_symm_buffer_mask_clear.restype = ctypes.c_int
_L.megamoe_symm_buffer_mask_clear.argtypes = [_vp]
_L.megamoe_serve_weight_cache_info.restype = None
_L.megamoe_serve_weight_cache_info.argtypes = [_P(ctypes.c_size_t), _P(ctypes.c_uint64),
                                               _P(ctypes.c_uint64)]
_L.megamoe_serve_weight_cache_clear.restype = None
_L.megamoe_serve_weight_cache_clear.argtypes = []
_L.megamoe_mega_moe.restype = ctypes.c_int
_L.megamoe_mega_moe.argtypes = [_vp, _P(_Args)]

_EMPTY = ctypes.create_string_buffer(64)  # data pointer of empty (but present) tensors


# ---- argument marshalling ---------------------------------------------------------------

class _Call:
    """Keeps the tensors alive during the C call and remembers the first local refusal."""

    def __init__(self):
        self.keep = []
        self.error = None

    def refuse(self, kind, message):
        self.error = self.error or (kind, message)

    def tensor(self, desc, t, name):
        if t is None:
            return None
        if not isinstance(t, torch.Tensor):
            self.refuse(TypeError, f"{name} must be a torch.Tensor, got {type(t).__name__}")
            return None
        if t.device.type != "cpu":
            self.refuse(ValueError, f"{name} must be a CPU tensor (got device {t.device})")
            return None
        code = _FROM_TORCH.get(t.dtype, _INVALID_DTYPE)
        if t.dtype not in (torch.float32, torch.bfloat16, torch.float16, torch.int8, torch.uint8,
                           torch.int32, torch.int64, torch.bool) and code != _INVALID_DTYPE:
            t = t.view(torch.uint8) if t.element_size() == 1 else t.view(torch.int64)
        t = t.contiguous()
        self.keep.append(t)
        desc.data = t.data_ptr() if t.numel() else ctypes.addressof(_EMPTY)
        desc.dtype = code
        desc.ndim = min(t.dim(), 4)
        if t.dim() > 4:
            self.refuse(ValueError, f"{name} has {t.dim()} dimensions (at most 4)")
        for i, s in enumerate(t.shape[:4]):
            desc.shape[i] = s
        return t

    def tensors(self, lst, value, name):
        """A list/tuple of tensors (a bare tensor counts as a one-element list)."""
        lst.count = 0
        if value is None:
            return
        if isinstance(value, torch.Tensor):
            value = [value]
        if not isinstance(value, (list, tuple)):
            self.refuse(TypeError, f"{name} must be a list of tensors, got {type(value).__name__}")
            return
        arr = (_Tensor * max(1, len(value)))()
        for i, t in enumerate(value):
            if t is None:
                self.refuse(TypeError, f"{name}[{i}] is None")
                continue
            self.tensor(arr[i], t, f"{name}[{i}]")
        self.keep.append(arr)
        lst.count = len(value)
        lst.items = arr

    def run(self, fn, *args):
        """The C call; a local refusal makes it take part in the first exchange with that error
        (every rank raises at once; this rank also the TypeError/ValueError it is)."""
        if self.error is None:
            check(fn(*args))
            return
        kind, message = self.error
        fail_next_call(message)
        try:
            st = fn(*args)
        finally:
            clear_next_call_error()
        if st == INVALID_ARGUMENT:
            cls = InvalidArgumentTypeError if kind is TypeError else InvalidArgumentError
            raise cls(st)
        if st == CALL_MISMATCH or st < 0:
            check(st)
        raise kind(message)


def _int_arg(call, value, name, minimum=None):
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        call.refuse(TypeError, f"{name} must be an int, got {type(value).__name__}")
        return 0
    v = int(value)
    if minimum is not None and v < minimum:
        call.refuse(ValueError, f"{name} = {v} must be >= {minimum}")
    return v


# ---- groups ------------------------------------------------------------------------------

def _resolve_group(group, heap_size=0):
    """(Comm, name) for a group as megamoe.ops takes it: a ProcessGroup, None/WORLD, a Comm, or a
    name from megamoe.comm.group_name."""
    if isinstance(group, _comm.Comm):
        return group
    if isinstance(group, str):
        return _comm.by_name(group)
    with _comm._lock:
        c = _comm._group_comm(group, heap_size=heap_size)
        c._user = True
        if _comm._world is not None:
            _comm._world._user = True
        return c


def _heap_for(cap_rows, hidden, world):
    """Heap bytes a process starting the runtime for this buffer asks for (0: the variable's)."""
    if os.environ.get("HYPER_PARALLEL_SHMEM_HEAP_SIZE"):
        return 0
    row = -(-max(hidden * 2, -(-hidden // 8) * 8 + 8 + -(-hidden // 32)) // 64) * 64
    need = cap_rows * row + 2 * world * 64 + (16 << 20)
    return max(1 << 30, -(-need // (64 << 20)) * (64 << 20))


# ---- SymmBuffer --------------------------------------------------------------------------

_buffers = weakref.WeakValueDictionary()  # id -> SymmBuffer (context tensors resolve to it)


class SymmBuffer:
    """The symmetric buffer one or more MoE layers share (CANN's SymmBuffer).

    ``dispatch_quant_mode`` and ``dispatch_quant_out_dtype`` are plain attributes every
    ``mega_moe`` call reads (vLLM-Ascend re-assigns them between layers of different
    quantisation); the other attributes are read-only."""

    _READ_ONLY = ("group", "rank_id", "group_name", "ep_world_size", "num_experts",
                  "num_max_tokens_per_rank", "num_topk", "hidden", "intermediate_hidden",
                  "max_recv_token_num", "combine_quant_mode", "comm_alg", "combine_comm_mode",
                  "topk_weights_type", "topo_type", "rank_num_per_server", "context",
                  "ccl_buffer_size", "mask_buffer")

    def __init__(self, handle, group, comm, kw):
        d = self.__dict__
        d["_handle"] = handle
        d["_comm"] = comm
        d["_ro"] = dict(kw)
        d["dispatch_quant_mode"] = kw.pop("dispatch_quant_mode")
        d["dispatch_quant_out_dtype"] = kw.pop("dispatch_quant_out_dtype")
        info = self._info()
        ro = d["_ro"]
        ro.pop("dispatch_quant_mode", None)
        ro.pop("dispatch_quant_out_dtype", None)
        ro.update(group=group, rank_id=info.rank, group_name=comm.name,
                  ep_world_size=info.world_size, topo_type=0,
                  rank_num_per_server=info.ranks_per_host,
                  context=torch.tensor([info.id & 0x7FFFFFFF, info.rank, info.world_size, 0],
                                       dtype=torch.int32),
                  mask_buffer=None)
        _buffers[int(info.id)] = self

    def __getattr__(self, name):
        ro = self.__dict__.get("_ro", {})
        if name == "ccl_buffer_size":
            return int(self._info().symmetric_bytes)
        if name in ro:
            return ro[name]
        raise AttributeError(f"'SymmBuffer' object has no attribute {name!r}")

    def __setattr__(self, name, value):
        if name in ("dispatch_quant_mode", "dispatch_quant_out_dtype"):
            self.__dict__[name] = value
            return
        if name in self._READ_ONLY:
            raise AttributeError(f"SymmBuffer.{name} is read-only")
        self.__dict__[name] = value

    def _info(self):
        info = _Info()
        check(_L.megamoe_symm_buffer_get_info_sized(self._live_handle(), ctypes.byref(info),
                                                    ctypes.sizeof(info)))
        return info

    def _live_handle(self):
        h = self.__dict__["_handle"]
        if not h:
            raise ValueError("the SymmBuffer was freed")
        return h

    @property
    def alive(self):
        """False after destroy() (or after the group's communicator was destroyed)."""
        h = self.__dict__["_handle"]
        return bool(h) and bool(self._info().alive)

    def info(self):
        """The buffer's resolved configuration and counters (a dict)."""
        i = self._info()
        return {"rank": i.rank, "world_size": i.world_size, "ranks_per_host": i.ranks_per_host,
                "alive": bool(i.alive), "local_experts": i.local_experts,
                "max_recv_rows": i.max_recv_rows, "symmetric_bytes": i.symmetric_bytes,
                "local_bytes": i.local_bytes, "calls": i.calls,
                "last_recv_rows": i.last_recv_rows, "id": i.id, "o1_calls": i.o1_calls}

    # -- lifecycle
    def destroy(self):
        """Release the buffer's symmetric memory (collective over the group; idempotent)."""
        h = self.__dict__["_handle"]
        if not h:
            return
        check(_L.megamoe_symm_buffer_destroy(h))

    def __del__(self):
        try:
            h = self.__dict__.get("_handle")
            if h:
                self.__dict__["_handle"] = None
                _L.megamoe_symm_buffer_free(h)  # local; memory stays until destroy/team end
        except Exception:  # pragma: no cover - interpreter shutdown
            pass

    def update_group(self, group):
        """Move the buffer to a new group of the same size (collective over the new group). The
        context tensor is updated in place; the mask stays."""
        comm = _resolve_group(group)
        check(_L.megamoe_symm_buffer_update_group(self._live_handle(), comm.handle))
        info = self._info()
        ro = self.__dict__["_ro"]
        ro.update(group=group, rank_id=info.rank, group_name=comm.name,
                  rank_num_per_server=info.ranks_per_host)
        self.__dict__["_comm"] = comm
        ctx = ro["context"]
        ctx[1] = info.rank
        ctx[3] += 1

    # -- the rank mask
    def _mask(self):
        p = ctypes.POINTER(ctypes.c_int32)()
        check(_L.megamoe_symm_buffer_mask(self._live_handle(), ctypes.byref(p)))
        ro = self.__dict__["_ro"]
        if ro["mask_buffer"] is None:
            w = ro["ep_world_size"]
            ro["mask_buffer"] = torch.from_numpy(np.ctypeslib.as_array(p, shape=(w,)))
        return ro["mask_buffer"]

    def query_mask_buffer(self, mask_status):
        """Copy the rank mask (1 = disabled) into mask_status, an int32 CPU tensor [W]."""
        w = self.ep_world_size
        if not isinstance(mask_status, torch.Tensor):
            raise TypeError(f"mask_status must be a torch.Tensor, got {type(mask_status).__name__}")
        if mask_status.dtype != torch.int32:
            raise TypeError(f"mask_status must be int32, got {mask_status.dtype}")
        if mask_status.device.type != "cpu":
            raise ValueError(f"mask_status must be a CPU tensor (got {mask_status.device})")
        if tuple(mask_status.shape) != (w,):
            raise ValueError(f"mask_status must have shape [{w}], got {list(mask_status.shape)}")
        if not mask_status.is_contiguous():
            raise ValueError("mask_status must be contiguous")
        mask_status.copy_(self._mask())
        return mask_status

    def update_mask_buffer(self, rank, masked):
        """Set this process's entry for `rank` (an int in [0, W)) to `masked` (a bool)."""
        if isinstance(rank, bool) or not isinstance(rank, numbers.Integral) \
                or not 0 <= int(rank) < self.ep_world_size:  # (CANN's wrapper: IndexError)
            raise IndexError(f"rank must be an int in [0, {self.ep_world_size}), got {rank!r}")
        if not isinstance(masked, bool):
            raise TypeError(f"masked must be a bool, got {type(masked).__name__}")
        self._mask()
        check(_L.megamoe_symm_buffer_mask_set(self._live_handle(), int(rank), int(masked)))

    def clean_mask_buffer(self):
        """Zero the local rank mask (creating it when absent)."""
        self._mask()
        check(_L.megamoe_symm_buffer_mask_clear(self._live_handle()))

    def get_local_buffer_tensor(self, dtype, size=None, offset=0):
        """A zero-copy view of this rank's part of the symmetric memory: `offset` counted in
        dtype elements, `size` None (1-D to the end) or a torch.Size. Valid until destroy() or
        update_group(); mega_moe calls overwrite it."""
        if not isinstance(dtype, torch.dtype):
            raise TypeError(f"dtype must be a torch.dtype, got {type(dtype).__name__}")
        if isinstance(offset, bool) or not isinstance(offset, numbers.Integral) or offset < 0:
            raise ValueError(f"offset must be a non-negative int, got {offset!r}")
        if size is not None and not isinstance(size, torch.Size):
            raise TypeError(f"size must be None or a torch.Size, got {type(size).__name__}")
        ptr, nbytes = ctypes.c_void_p(), ctypes.c_size_t()
        check(_L.megamoe_symm_buffer_local(self._live_handle(), ctypes.byref(ptr),
                                           ctypes.byref(nbytes)))
        item = torch.empty((), dtype=dtype).element_size()
        total = nbytes.value // item
        left = total - int(offset)
        want = left if size is None else math.prod(size)
        if left < 0 or want > left:
            raise ValueError(f"the buffer holds {total} {dtype} elements; offset {int(offset)} "
                             f"with {want} elements does not fit")
        raw = np.ctypeslib.as_array(ctypes.cast(ptr, ctypes.POINTER(ctypes.c_uint8)),
                                    shape=(total * item,))
        t = torch.from_numpy(raw).view(dtype)[int(offset):int(offset) + want]
        return t if size is None else t.view(size)

    def __repr__(self):
        state = "alive" if self.__dict__["_handle"] and self.alive else "destroyed"
        return (f"<megamoe SymmBuffer {state} group {self.group_name} rank {self.rank_id}/"
                f"{self.ep_world_size} E={self.num_experts} K={self.num_topk} H={self.hidden}>")


def get_symm_buffer_for_mega_moe(group, num_experts, num_max_tokens_per_rank, num_topk, hidden,
                                 intermediate_hidden, *, max_recv_token_num=0,
                                 dispatch_quant_mode=0, dispatch_quant_out_dtype=None,
                                 combine_quant_mode=0, comm_alg="", combine_comm_mode=0,
                                 topk_weights_type=0, use_ccl_buffer=True):
    """Create the symmetric buffer of `mega_moe` (collective over the group's members).
    ``use_ccl_buffer`` (CANN's older wrapper) is accepted and ignored."""
    call = _Call()
    vals = {}
    for name, v, mn in (("num_experts", num_experts, None),
                        ("num_max_tokens_per_rank", num_max_tokens_per_rank, None),
                        ("num_topk", num_topk, None), ("hidden", hidden, None),
                        ("intermediate_hidden", intermediate_hidden, None),
                        ("max_recv_token_num", max_recv_token_num, None),
                        ("dispatch_quant_mode", dispatch_quant_mode, None),
                        ("combine_quant_mode", combine_quant_mode, None),
                        ("combine_comm_mode", combine_comm_mode, None),
                        ("topk_weights_type", topk_weights_type, None)):
        vals[name] = _int_arg(call, v, name, mn)
    out, err = _serve_type(dispatch_quant_out_dtype, "dispatch_quant_out_dtype")
    if err:
        call.refuse(*err)
    if out in (T_BF16, T_INT4):
        call.refuse(ValueError, f"dispatch_quant_out_dtype {_TYPE_NAMES[out]} is not a dispatch "
                                "type (None, int8, float8_e4m3fn, float8_e5m2, float4_e2m1fn_x2)")
    if comm_alg is None:
        comm_alg = ""
    if not isinstance(comm_alg, str):
        call.refuse(TypeError, f"comm_alg must be a str, got {type(comm_alg).__name__}")
        comm_alg = ""
    w_guess = None
    try:
        e, k, nmax = vals["num_experts"], vals["num_topk"], vals["num_max_tokens_per_rank"]
        import torch.distributed as dist
        if dist.is_available() and dist.is_initialized() and not isinstance(group, (str, _comm.Comm)):
            w_guess = dist.get_world_size(group) if group is not None else dist.get_world_size()
        cap = vals["max_recv_token_num"] or nmax * (w_guess or 1) * min(k, max(1, e // (w_guess or 1)))
        # (+ the return rows a group spanning hosts adds: not known here, so counted)
        heap = _heap_for(max(cap, 0) + max(nmax * k, 0), max(vals["hidden"], 1), w_guess or 1)
    except Exception:  # sizing is a convenience; the library checks everything
        heap = 0
    comm = _resolve_group(group, heap)
    p = _lib.default(_Params)
    for name in ("num_experts", "num_max_tokens_per_rank", "num_topk", "hidden",
                 "intermediate_hidden", "max_recv_token_num", "dispatch_quant_mode",
                 "combine_quant_mode", "combine_comm_mode", "topk_weights_type"):
        setattr(p, name, vals[name])
    p.dispatch_quant_out_dtype = out if out != _T_INVALID else 0
    alg = comm_alg.encode()
    p.comm_alg = alg
    handle = ctypes.c_void_p()
    call.run(_L.megamoe_symm_buffer_create, comm.handle, ctypes.byref(p), ctypes.byref(handle))
    kw = dict(num_experts=vals["num_experts"],
              num_max_tokens_per_rank=vals["num_max_tokens_per_rank"], num_topk=vals["num_topk"],
              hidden=vals["hidden"], intermediate_hidden=vals["intermediate_hidden"],
              max_recv_token_num=vals["max_recv_token_num"],
              dispatch_quant_mode=vals["dispatch_quant_mode"],
              dispatch_quant_out_dtype=dispatch_quant_out_dtype,
              combine_quant_mode=vals["combine_quant_mode"], comm_alg=comm_alg,
              combine_comm_mode=vals["combine_comm_mode"],
              topk_weights_type=vals["topk_weights_type"])
    return SymmBuffer(handle, group, comm, kw)


# ---- mega_moe ---------------------------------------------------------------------------

_ACT_KEYS = {"swiglu": (), "swiglustep": (), "swigluoai": ("alpha", "beta"),
             "situglu": ("beta", "linear_beta")}
_ACT_ALIASES = {"situ": "situglu", "swiglu_gpt_oss": "swigluoai"}
_BITS = {"alpha": 1, "beta": 2, "linear_beta": 4}


def _buffer_of(sym_buffer):
    if isinstance(sym_buffer, SymmBuffer):
        return sym_buffer
    if isinstance(sym_buffer, torch.Tensor) and sym_buffer.dtype == torch.int32 \
            and sym_buffer.numel() == 4:  # a context tensor (the torch op's handle)
        b = _buffers.get(int(sym_buffer[0]))
        if b is not None:
            return b
    raise TypeError(f"sym_buffer must be the SymmBuffer of get_symm_buffer_for_mega_moe, got "
                    f"{type(sym_buffer).__name__}")


# ---- torch.ops.megamoe.mega_moe: the schema, its normalisation, the CPU body, the fake ------
# The public mega_moe (below) keeps CANN's signature; what the schema cannot carry is normalised
# on the way in: the SymmBuffer travels as its context tensor (the registry resolves it), the
# activation_params dict as JSON text, dtype spellings as integer codes. Values of the wrong
# kind become markers the body refuses on every rank (a collective cannot raise on one).

_SCHEMA = (
    "mega_moe(Tensor? x, Tensor? topk_ids, Tensor? topk_weights, Tensor[] l1_weights, "
    "Tensor[] l2_weights, Tensor sym_buffer, *, Tensor[]? l1_weights_sf=None, "
    "Tensor[]? l2_weights_sf=None, Tensor[]? l1_bias=None, Tensor[]? l2_bias=None, "
    "Tensor? x_active_mask=None, Tensor? scales=None, str? activation=\"swiglu\", "
    "float? activation_clamp=None, str? activation_params=None, int? weight1_type=None, "
    "int? weight2_type=None, int? shared_expert_quant_out_dtype=None, "
    "int? shared_weight1_type=None, int? shared_weight2_type=None, "
    "Tensor[]? shared_l1_weights=None, Tensor[]? shared_l2_weights=None, "
    "Tensor[]? shared_l1_weights_sf=None, Tensor[]? shared_l2_weights_sf=None, "
    "Tensor[]? shared_l1_bias=None, Tensor[]? shared_l2_bias=None, float? beta=None, "
    "float? linear_beta=None) -> (Tensor, Tensor)")

_NOT_A_TYPE = -(1 << 31)  # a dtype argument of the wrong Python kind (TypeError in the body)
_TORCH_CODES = {torch.int8: 1, torch.bfloat16: 15}
for _n, _c in (("float8_e5m2", 23), ("float8_e4m3fn", 24)):
    if hasattr(torch, _n):
        _TORCH_CODES[getattr(torch, _n)] = _c


def _type_code(value):
    """A dtype spelling as the schema's int: None, an int code as given, torch dtypes and the
    fp8 tokens to their codes (an unknown dtype to an unknown code: ValueError in the body)."""
    if value is None or (isinstance(value, numbers.Integral) and not isinstance(value, bool)):
        return None if value is None else int(value)
    if isinstance(value, Float8Dtype):
        return 24 if value.code == _E4M3 else 23
    if isinstance(value, torch.dtype):
        return _TORCH_CODES.get(value, 1 << 20)
    return _NOT_A_TYPE


def _params_text(value):
    if value is None:
        return None
    if not isinstance(value, dict):
        return "\x00" + type(value).__name__  # refused by the body (TypeError)
    return json.dumps({str(k): v for k, v in value.items()}, default=repr)


def _buffer_arg(value):
    if isinstance(value, SymmBuffer):
        return value.context
    if not isinstance(value, torch.Tensor):  # no group to tell: a local TypeError
        _buffer_of(value)
    return value  # a context tensor (the body resolves it; a fake kernel never reads it)


_NORMALIZE = {"sym_buffer": _buffer_arg, "activation_params": _params_text,
              **{n: _type_code for n in ("weight1_type", "weight2_type",
                                         "shared_expert_quant_out_dtype", "shared_weight1_type",
                                         "shared_weight2_type")}}


def _fake(x, topk_ids, topk_weights, l1_weights, l2_weights, sym_buffer, *, l1_weights_sf=None,
          l2_weights_sf=None, l1_bias=None, l2_bias=None, x_active_mask=None, scales=None,
          activation="swiglu", activation_clamp=None, activation_params=None, weight1_type=None,
          weight2_type=None, shared_expert_quant_out_dtype=None, shared_weight1_type=None,
          shared_weight2_type=None, shared_l1_weights=None, shared_l2_weights=None,
          shared_l1_weights_sf=None, shared_l2_weights_sf=None, shared_l1_bias=None,
          shared_l2_bias=None, beta=None, linear_beta=None):
    """Shapes without data: y [n, H] bf16 (x's), expert_token_nums [L] int32 (L from the
    weights: the list's length, or a stacked tensor's dim0)."""
    L = l1_weights[0].shape[0] if len(l1_weights) == 1 and l1_weights[0].dim() == 3 else len(l1_weights)
    return (x.new_empty((x.shape[0], x.shape[1]), dtype=torch.bfloat16),
            x.new_empty((L,), dtype=torch.int32))


def _body(x, topk_ids, topk_weights, l1_weights, l2_weights, sym_buffer, *, l1_weights_sf=None,
          l2_weights_sf=None, l1_bias=None, l2_bias=None, x_active_mask=None, scales=None,
          activation="swiglu", activation_clamp=None, activation_params=None, weight1_type=None,
          weight2_type=None, shared_expert_quant_out_dtype=None, shared_weight1_type=None,
          shared_weight2_type=None, shared_l1_weights=None, shared_l2_weights=None,
          shared_l1_weights_sf=None, shared_l2_weights_sf=None, shared_l1_bias=None,
          shared_l2_bias=None, beta=None, linear_beta=None):
    """The CPU body of torch.ops.megamoe.mega_moe (the normalised arguments)."""
    buf = _buffer_of(sym_buffer)
    if not buf.alive:  # destroyed on every rank (destroy is collective): local
        raise InvalidArgumentError(INVALID_ARGUMENT, "mega_moe: the SymmBuffer was destroyed (by "
                                   "destroy(), or with its group's communicator); create a new "
                                   "one with get_symm_buffer_for_mega_moe")
    call = _Call()
    a = _lib.default(_Args)
    call.tensor(a.x, x, "x")
    if x is None:
        call.refuse(TypeError, "x is required (a bf16 tensor [n, hidden])")
    call.tensor(a.topk_ids, topk_ids, "topk_ids")
    call.tensor(a.topk_weights, topk_weights, "topk_weights")
    for name, v in (("l1_weights", l1_weights), ("l2_weights", l2_weights),
                    ("l1_weights_sf", l1_weights_sf), ("l2_weights_sf", l2_weights_sf),
                    ("l1_bias", l1_bias), ("l2_bias", l2_bias),
                    ("shared_l1_weights", shared_l1_weights),
                    ("shared_l2_weights", shared_l2_weights),
                    ("shared_l1_weights_sf", shared_l1_weights_sf),
                    ("shared_l2_weights_sf", shared_l2_weights_sf),
                    ("shared_l1_bias", shared_l1_bias), ("shared_l2_bias", shared_l2_bias)):
        call.tensors(getattr(a, name), v, name)
    # the weights' version for the library's packed copies: torch bumps a tensor's version
    # counter (shared by its views) on every in-place change
    version = 0
    for v in (l1_weights, l2_weights, shared_l1_weights, shared_l2_weights):
        for t in (v if isinstance(v, (list, tuple)) else [v]):
            if isinstance(t, torch.Tensor):
                version = (version * 1000003 + t._version + 1) & 0xFFFFFFFFFFFFFFFF
    a.weights_version = version
    call.tensor(a.x_active_mask, x_active_mask, "x_active_mask")
    call.tensor(a.scales, scales, "scales")
    # activation, its parameters (and the older DeepEP keywords beta= / linear_beta=)
    if activation is None:
        activation = "swiglu"
    if not isinstance(activation, str):
        call.refuse(TypeError, f"activation must be a str, got {type(activation).__name__}")
        activation = "swiglu"
    act = _ACT_ALIASES.get(activation, activation)
    params = {}
    if isinstance(activation_params, str) and activation_params.startswith("\x00"):
        call.refuse(TypeError, f"activation_params must be a dict or None, got "
                               f"{activation_params[1:]}")
    elif isinstance(activation_params, dict):  # (the body called directly)
        params.update(activation_params)
    elif activation_params:
        params.update(json.loads(activation_params))
    if beta is not None:
        params.setdefault("beta", beta)
    if linear_beta is not None and linear_beta != 0:
        params.setdefault("linear_beta", linear_beta)
    bits = 0
    for key, value in params.items():
        if value is None:  # counts as absent (Kimi-K3 passes linear_beta=None)
            continue
        if act in _ACT_KEYS and key not in _ACT_KEYS[act]:
            allowed = ", ".join(_ACT_KEYS[act]) or "none"
            call.refuse(ValueError, f"activation_params key {key!r} is not allowed for activation "
                                    f"{act!r} (allowed: {allowed})")
            continue
        if key not in _BITS:
            call.refuse(ValueError, f"activation_params key {key!r} is unknown")
            continue
        if isinstance(value, bool) or not isinstance(value, numbers.Real):
            call.refuse(TypeError, f"activation_params[{key!r}] must be a number, got "
                                   f"{type(value).__name__}")
            continue
        setattr(a, key, float(value))
        bits |= _BITS[key]
    a.activation = act.encode(errors="replace")
    call.keep.append(a.activation)
    a.activation_params_set = bits
    if activation_clamp is None:
        activation_clamp = 0.0
    if isinstance(activation_clamp, bool) or not isinstance(activation_clamp, numbers.Real):
        call.refuse(TypeError, f"activation_clamp must be a number or None, got "
                               f"{type(activation_clamp).__name__}")
        activation_clamp = 0.0
    a.activation_clamp = float(activation_clamp)
    for name, v in (("weight1_type", weight1_type), ("weight2_type", weight2_type),
                    ("shared_weight1_type", shared_weight1_type),
                    ("shared_weight2_type", shared_weight2_type),
                    ("shared_expert_quant_out_dtype", shared_expert_quant_out_dtype)):
        if v == _NOT_A_TYPE:
            t, err = _T_INVALID, (TypeError, f"{name} must be None, a torch.dtype or an int")
        else:
            t, err = _serve_type(v, name)
        if err:
            call.refuse(*err)
        setattr(a, name, t if t != _T_INVALID else 0)
    # the buffer's current quantisation attributes (plain Python attributes)
    mode = buf.__dict__["dispatch_quant_mode"]
    if isinstance(mode, bool) or not isinstance(mode, numbers.Integral):
        call.refuse(TypeError, f"sym_buffer.dispatch_quant_mode must be an int, got "
                               f"{type(mode).__name__}")
        mode = 0
    out, err = _serve_type(buf.__dict__["dispatch_quant_out_dtype"], "sym_buffer.dispatch_quant_out_dtype")
    if err:
        call.refuse(*err)
        out = 0
    check(_L.megamoe_symm_buffer_set_quant(buf._live_handle(), int(mode), int(out)))
    # outputs
    n = x.shape[0] if isinstance(x, torch.Tensor) and x.dim() == 2 else 0
    L = buf.num_experts // buf.ep_world_size
    y = torch.empty((n, buf.hidden), dtype=torch.bfloat16)
    etn = torch.zeros((L,), dtype=torch.int32)
    call.tensor(a.y, y, "y")
    call.tensor(a.expert_token_nums, etn, "expert_token_nums")
    call.run(_L.megamoe_mega_moe, buf._live_handle(), ctypes.byref(a))
    return y, etn


_OP = _megamoe.define(_SCHEMA, fake=_fake, collective=True, normalize=_NORMALIZE)(_body)

_LISTS = ("l1_weights", "l2_weights", "l1_weights_sf", "l2_weights_sf", "l1_bias", "l2_bias",
          "shared_l1_weights", "shared_l2_weights", "shared_l1_weights_sf",
          "shared_l2_weights_sf", "shared_l1_bias", "shared_l2_bias")


def mega_moe(x, topk_ids, topk_weights, l1_weights, l2_weights, sym_buffer, *, l1_weights_sf=None,
             l2_weights_sf=None, l1_bias=None, l2_bias=None, x_active_mask=None, scales=None,
             activation="swiglu", activation_clamp=None, activation_params=None,
             weight1_type=None, weight2_type=None, shared_expert_quant_out_dtype=None,
             shared_weight1_type=None, shared_weight2_type=None, shared_l1_weights=None,
             shared_l2_weights=None, shared_l1_weights_sf=None, shared_l2_weights_sf=None,
             shared_l1_bias=None, shared_l2_bias=None, beta=None, linear_beta=None):
    """Returns (y [n, H] bf16, expert_token_nums [L] int32). Collective over the buffer's group
    (its unmasked ranks); forward only; runs torch.ops.megamoe.mega_moe. docs/serve.md."""
    kw = dict(locals())
    args = [kw.pop(n) for n in ("x", "topk_ids", "topk_weights", "l1_weights", "l2_weights",
                                "sym_buffer")]
    # a tensor list of the wrong kind would fail the schema's binder on this rank only: the
    # body refuses it on every rank instead
    for n in _LISTS:
        v = args[3] if n == "l1_weights" else args[4] if n == "l2_weights" else kw[n]
        if isinstance(v, torch.Tensor):
            v = [v]
            if n == "l1_weights":
                args[3] = v
            elif n == "l2_weights":
                args[4] = v
            else:
                kw[n] = v
        if v is not None and (not isinstance(v, (list, tuple)) or
                              not all(isinstance(t, torch.Tensor) for t in v)):
            return _OP.ctypes_path(*args, **kw)
    if not isinstance(activation, (str, type(None))) or (
            activation_clamp is not None and not isinstance(activation_clamp, numbers.Real)):
        return _OP.ctypes_path(*args, **kw)
    if isinstance(args[0], torch.Tensor) and args[0].device.type == "meta" and \
            isinstance(args[5], SymmBuffer):  # shapes only: the handle joins the meta tensors
        args[5] = args[5].context.to("meta")
    return _OP(*args, **kw)


mega_moe.op = _OP  # the torch.library operator (torch.ops.megamoe.mega_moe)


def weight_cache_info():
    """The process-wide cache of packed expert weights mega_moe keeps between calls:
    {"bytes", "hits", "misses"} (MEGAMOE_SERVE_WEIGHT_CACHE bounds the bytes; docs/serve.md)."""
    b, h, m = ctypes.c_size_t(), ctypes.c_uint64(), ctypes.c_uint64()
    _L.megamoe_serve_weight_cache_info(ctypes.byref(b), ctypes.byref(h), ctypes.byref(m))
    return {"bytes": b.value, "hits": h.value, "misses": m.value}


def clear_weight_cache():
    """Drop every packed weight copy (e.g. after unloading a model; not during a call)."""
    _L.megamoe_serve_weight_cache_clear()
