"""torch_npu-compatible MoeDistributeDispatchV2 / CombineV2 / CombineAddRmsNorm on CPUs.

Same names, argument order, keyword defaults and return tuples as ``torch_npu``, so code written
for Ascend runs by swapping the module (the ``npu_`` prefix is optional)::

    import megamoe.ops as ops
    group_ep = megamoe.comm.group_name(ep_process_group)      # a torch.distributed gloo group
    expand_x, dynamic_scales, assist_info, expert_token_nums, ep_recv_counts, tp_recv_counts, \
        expand_scales = ops.npu_moe_distribute_dispatch_v2(x, expert_ids, group_ep, ep_world_size,
                                                           ep_rank_id, moe_expert_num)
    x_out = ops.npu_moe_distribute_combine_v2(expert_out, expert_ids, assist_info, ep_recv_counts,
                                              expert_scales, group_ep, ep_world_size, ep_rank_id,
                                              moe_expert_num)

``group_ep`` / ``group_tp`` are communicator names from ``megamoe.comm.group_name(pg)`` (a
``megamoe.comm.Comm`` works too). Every rank of the world calls the operators in the same order
(their symmetric workspaces are allocated collectively over the world). ``y_dtype`` picks the
quantised output type: ``torch.int8``, ``torch.float8_e4m3fn`` / ``float8_e5m2`` (or
``megamoe.float8_*``, or torch_npu's integer codes); fp8 outputs are float8 tensors where torch
has the type (``uint8`` bytes on torch 1.13), quant_mode 4's e8m0 scales ``uint8``. Every operator
here is ``torch.ops.megamoe.<name>`` too (megamoe/_library.py, docs/torch.md).
Unwritten output regions are zero. The combines' ``comm_quant_mode`` is 0, 2 (int8), 3 or 4
(MX fp8_e5m2 / fp8_e4m3fn, the Ascend 950 transport). torch_npu's V1 pair
``npu_moe_distribute_dispatch`` / ``npu_moe_distribute_combine`` maps onto V2 (_ops_v1.py).
Semantics: docs/ops.md.
"""
import ctypes
from typing import NamedTuple

import torch

from . import _adapter, _dtypes, _lib
from . import comm as _comm
from ._dtypes import Float8Dtype, float8_e4m3fn, float8_e5m2
from ._library import FAKE_BY_BODY, concrete, faking, stand_in
from ._library import megamoe as _megamoe
from .errors import (CALL_MISMATCH, INVALID_ARGUMENT, InvalidArgumentError,
                     InvalidArgumentTypeError, MegaMoeError, check, clear_next_call_error,
                     fail_next_call)

__all__ = ["npu_moe_distribute_dispatch_v2", "npu_moe_distribute_combine_v2",
           "npu_moe_distribute_combine_add_rms_norm", "moe_distribute_dispatch_v2",
           "moe_distribute_combine_v2", "moe_distribute_combine_add_rms_norm",
           "npu_moe_distribute_dispatch", "npu_moe_distribute_combine", "moe_distribute_dispatch",
           "moe_distribute_combine", "float8_e4m3fn", "float8_e5m2", "release", "QuantMode",
           "quant_modes", "comm_quant_modes"]

# megamoe_dtype_t codes (include/megamoe/dtype.h) and the torch dtypes of each (megamoe/_dtypes.py)
_FP32, _BF16, _FP16, _E4M3, _E5M2, _E8M0, _INT8, _UINT8, _INT32, _INT64, _BOOL = range(11)
_INVALID = _dtypes.INVALID  # a dtype the library rejects with a message naming the parameter
_FROM_TORCH = _dtypes._FROM_TORCH
_TO_TORCH = _dtypes._TO_TORCH


@_lib.mirror("megamoe_tensor_t")
class _Tensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("dtype", ctypes.c_int), ("ndim", ctypes.c_int),
                ("shape", ctypes.c_int64 * 4)]


_T = _Tensor
_I = ctypes.c_int64
_P = ctypes.c_void_p


def _tensors(*names):
    return [(n, _T) for n in names]


def _ints(*names):
    return [(n, _I) for n in names]


_SIZE = [("struct_size", ctypes.c_size_t)]  # extensible structs (megamoe/version.h)


@_lib.mirror("megamoe_dispatch_v2_args_t")
class _DispatchArgs(ctypes.Structure):
    _fields_ = (_SIZE + _tensors("x", "expert_ids", "scales", "x_active_mask", "expert_scales",
                         "elastic_info", "performance_info")
                + [("group_ep", _P)] + _ints("ep_world_size", "ep_rank_id", "moe_expert_num")
                + [("group_tp", _P)] + _ints("tp_world_size", "tp_rank_id")
                + _ints("expert_shard_type", "shared_expert_num", "shared_expert_rank_num",
                        "quant_mode", "global_bs", "expert_token_nums_type")
                + [("comm_alg", ctypes.c_char_p)]
                + _ints("zero_expert_num", "copy_expert_num", "const_expert_num")
                + _tensors("expand_x", "dynamic_scales", "assist_info_for_combine",
                           "expert_token_nums", "ep_recv_counts", "tp_recv_counts",
                           "expand_scales")
                + [("zero_fill", ctypes.c_int)])


@_lib.mirror("megamoe_combine_v2_args_t")
class _CombineArgs(ctypes.Structure):
    _fields_ = (_SIZE + _tensors("expand_x", "expert_ids", "assist_info_for_combine", "ep_send_counts",
                         "expert_scales", "tp_send_counts", "x_active_mask", "expand_scales",
                         "shared_expert_x", "elastic_info", "ori_x", "const_expert_alpha_1",
                         "const_expert_alpha_2", "const_expert_v", "performance_info",
                         "activation_scale", "weight_scale", "group_list")
                + [("group_ep", _P)] + _ints("ep_world_size", "ep_rank_id", "moe_expert_num")
                + [("group_tp", _P)] + _ints("tp_world_size", "tp_rank_id")
                + _ints("expert_shard_type", "shared_expert_num", "shared_expert_rank_num",
                        "global_bs", "out_dtype", "comm_quant_mode", "group_list_type")
                + [("comm_alg", ctypes.c_char_p)]
                + _ints("zero_expert_num", "copy_expert_num", "const_expert_num")
                + _tensors("x") + [("zero_fill", ctypes.c_int)])


@_lib.mirror("megamoe_combine_add_rms_norm_args_t")
class _AddRmsNormArgs(ctypes.Structure):
    _fields_ = (_SIZE + [("combine", _CombineArgs)] + _tensors("residual_x", "gamma")
                + [("norm_eps", ctypes.c_double)] + _tensors("y", "rstd"))


_L = _lib.lib
for _name, _st in (("dispatch_v2", _DispatchArgs), ("combine_v2", _CombineArgs),
                   ("combine_add_rms_norm", _AddRmsNormArgs)):
    for _fn in (f"megamoe_{_name}_infer", f"megamoe_{_name}"):
        getattr(_L, _fn).restype = ctypes.c_int
        getattr(_L, _fn).argtypes = [ctypes.POINTER(_st)]
_L.megamoe_ops_struct_size.restype = ctypes.c_int64
_L.megamoe_ops_struct_size.argtypes = [ctypes.c_int]
_L.megamoe_ops_release.restype = ctypes.c_int
_L.megamoe_ops_release.argtypes = []


# ---- quantisation modes: the library's one table (megamoe_quant_mode_info) --------------------

@_lib.mirror("megamoe_quant_mode_info_t")
class _QuantInfo(ctypes.Structure):
    _fields_ = [("mode", ctypes.c_int64), ("name", ctypes.c_char_p), ("same_as_input", ctypes.c_int),
                ("out_dtypes", ctypes.c_uint32), ("scale_group", ctypes.c_int64),
                ("scale_dtype", ctypes.c_int), ("scale_same_as_input", ctypes.c_int),
                ("smoothing", ctypes.c_int)]


class QuantMode(NamedTuple):
    """One quant_mode (dispatch) or comm_quant_mode (combine) as the library implements it."""
    mode: int
    name: str            # "none", "static", "per_token", "per_group", "mx"; "int8", "mx_fp8_e5m2", ...
    out_dtypes: tuple    # accepted expand_x dtypes (dispatch) / the wire dtype (combine); () = x's own
    scale_group: int     # elements per scale: 0 none, -1 one per row
    scale_dtype: object  # torch.float32 or the e8m0 bytes (torch.uint8); None: x's own (int8 transport)
    smoothing: str       # the dispatch scales tensor: "none", "optional" or "required"


# megamoe_ops_struct_t (include/megamoe/ops.h): the mirrors above must have the library's sizes
_STRUCTS = {0: _Tensor, 1: _DispatchArgs, 2: _CombineArgs, 3: _AddRmsNormArgs, 4: _QuantInfo}
for _i, _st in _STRUCTS.items():
    if _L.megamoe_ops_struct_size(_i) != ctypes.sizeof(_st):
        raise ImportError(f"megamoe.ops: {_st.__name__} is {ctypes.sizeof(_st)} bytes but the "
                          f"library's is {_L.megamoe_ops_struct_size(_i)}; rebuild libmegamoe")

_L.megamoe_quant_mode_info.restype = ctypes.c_int
_L.megamoe_quant_mode_info.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.POINTER(_QuantInfo)]


def _quant_table(which):
    rows, info = [], _QuantInfo()
    while _L.megamoe_quant_mode_info(which, len(rows), ctypes.byref(info)) == 0:
        codes = [c for c in range(32) if info.out_dtypes >> c & 1]
        rows.append(QuantMode(
            info.mode, info.name.decode(),
            tuple(_PY_DTYPE.get(c, _TO_TORCH.get(c)) for c in codes),
            info.scale_group, None if info.scale_same_as_input else _TO_TORCH.get(info.scale_dtype),
            ("none", "optional", "required")[info.smoothing]))
    return tuple(rows)


_PY_DTYPE = {_E4M3: float8_e4m3fn, _E5M2: float8_e5m2}  # fp8: torch's types (1.13: the tokens)
_QUANT_MODES = _quant_table(0)
_COMM_QUANT_MODES = _quant_table(1)


def quant_modes():
    """The dispatch quant_modes (a tuple of QuantMode), from the library's table."""
    return _QUANT_MODES


def comm_quant_modes():
    """The combine comm_quant_modes (a tuple of QuantMode), from the library's table."""
    return _COMM_QUANT_MODES


def release():
    """Free the operators' symmetric workspaces now (collective over the world). Optional:
    destroying the last communicator (megamoe.comm.shutdown, also run at exit) frees them."""
    check(_L.megamoe_ops_release())


# ---- marshalling ---------------------------------------------------------------------------

class _Call:
    """Keeps the contiguous tensors alive while the C call runs. In a fake kernel
    (``_library.faking()``) it describes shapes only: data pointers go to zeroed stand-ins, outputs
    are allocated like the inputs (fake or meta tensors) and nothing is called."""

    def __init__(self):
        self.keep = []
        self.error = None  # the first argument this binding refuses
        self.fake = faking()
        self.device = None  # fake kernels: where the outputs go (the inputs' device)

    def tensor(self, desc, t, name, dtype_code=None):
        """Describe t for C. Problems the C side can name (dtype, rank) are passed through as
        invalid descriptors rather than raised here: an exception on one rank only would leave
        the other ranks waiting in the collective. What only Python sees (not a tensor, not on
        the CPU) is kept in self.error and handed to the call (run)."""
        if t is None:
            return None
        if not isinstance(t, torch.Tensor):
            self.error = self.error or (TypeError,
                                        f"{name} must be a torch.Tensor, got {type(t).__name__}")
            return None
        if self.fake:
            self.device = self.device or t.device
            shape = [concrete(n) for n in t.shape]
            numel = 1
            for n in shape:
                numel *= n
            buf = stand_in(numel * t.element_size())
            self.keep.append(buf)
            desc.data = ctypes.addressof(buf)
        else:
            if t.device.type != "cpu":
                self.error = self.error or (ValueError,
                                            f"{name} must be a CPU tensor (got device {t.device})")
                return None
            t = t.contiguous()
            self.keep.append(t)
            shape = t.shape
            desc.data = t.data_ptr() if t.numel() else ctypes.addressof(_EMPTY)
        desc.dtype = _dtypes.code_of(t.dtype) if dtype_code is None else dtype_code
        desc.ndim = len(shape)
        for i, n in enumerate(shape[:4]):
            desc.shape[i] = n
        return t

    def alloc(self, desc):
        """The output desc describes (dtype and shape from megamoe_*_infer), on the CPU."""
        shape = tuple(desc.shape[i] for i in range(desc.ndim))
        dtype = _dtypes.torch_dtype(desc.dtype)
        if self.fake:
            return torch.empty(shape, dtype=dtype, device=self.device or "cpu")
        t = torch.empty(shape, dtype=dtype, device="cpu")
        desc.data = t.data_ptr() if t.numel() else ctypes.addressof(_EMPTY)
        return t

    def run(self, fn, args):
        """The C operator call; with a refused argument it takes part in its first exchange
        with that error, so every rank raises the same InvalidArgumentError at once (on this
        rank also the TypeError/ValueError it is). Without a runtime to tell (no collective
        possible) this rank's own error is raised. A fake kernel calls nothing."""
        if self.fake:
            return
        if self.error is None:
            check(fn(ctypes.byref(args)))
            return
        kind, message = self.error
        fail_next_call(message)
        try:
            st = fn(ctypes.byref(args))
        finally:
            clear_next_call_error()
        if st == INVALID_ARGUMENT:
            cls = InvalidArgumentTypeError if kind is TypeError else InvalidArgumentError
            raise cls(st)
        if st == CALL_MISMATCH:
            check(st)
        raise kind(message)


_EMPTY = ctypes.create_string_buffer(64)  # data pointer of empty (but present) tensors


def _comm_handle(group, what):
    """Handle of the communicator a group name (see _group_name) names; None when absent or
    unknown, which the library reports as an invalid argument on every rank."""
    if not group:
        return None
    try:
        return _comm.by_name(group).handle
    except MegaMoeError:
        return None


def _scales_code(scales_dtype, scales=None):
    """megamoe_dtype_t of dispatch's scales from the schema's ``int? scales_dtype`` (a torch_npu
    code): fp32, or the MX e8m0 bytes (293 / 44, or uint8 0: scales in uint8 are always e8m0
    bytes); None: the tensor's own type (a uint8 tensor: e8m0 bytes)."""
    if scales_dtype is None:
        if isinstance(scales, torch.Tensor) and scales.dtype == torch.uint8:
            return _E8M0
        return None
    code = _dtypes.from_npu_code(scales_dtype)
    return _E8M0 if code == _UINT8 else code  # anything else: the library names the rule


def _y_code(y_dtype):
    """megamoe_dtype_t of the schema's ``int? y_dtype`` (a torch_npu dtype code, see _dtypes)."""
    if y_dtype is None:
        return None
    return _dtypes.from_npu_code(y_dtype)


# ---- registration (python/megamoe/_library.py) ----------------------------------------------
# Every operator below is torch.ops.megamoe.<name>; megamoe.ops.<name> normalises its arguments
# once (groups -> communicator names, dtypes -> torch_npu codes) and calls it. The CPU kernel is
# the body below, or the Torch adapter's C++ kernel when it is built for this torch.

def _group_name(group):
    """A group as the schema takes it: the communicator's name ("" when absent or dead)."""
    if group is None or isinstance(group, str):
        return group or ""
    if isinstance(group, _comm.Comm):
        return group.name if group.alive else ""
    return _comm.for_group(group).name  # a torch.distributed ProcessGroup


def _scales_npu_code(dtype):
    """dispatch's scales_dtype as a torch_npu code: uint8 (and torch's float8_e8m0fnu) name the
    MX e8m0 bytes (293), "e8m0" too; anything else as _dtypes.npu_code."""
    if dtype is torch.uint8 or (isinstance(dtype, str) and dtype in ("e8m0", "float8_e8m0fnu")):
        return 293
    return _dtypes.npu_code(dtype)


_NORMALIZE = {"group_ep": _group_name, "group_tp": _group_name, "y_dtype": _dtypes.npu_code,
              "x_dtype": _dtypes.npu_code, "scales_dtype": _scales_npu_code}


def _define(schema, normalize=_NORMALIZE):
    return _megamoe.define(schema, fake=FAKE_BY_BODY, collective=True, normalize=normalize)


def _perf(call, desc, performance_info):
    """performance_info accumulates in place; a non-contiguous tensor gets the sum copied back."""
    if performance_info is None:
        return None
    t = call.tensor(desc, performance_info, "performance_info")
    return t


def _perf_back(call, performance_info, t):
    if t is not None and not call.fake and t.data_ptr() != performance_info.data_ptr():
        performance_info.copy_(t)


# ---- MoeDistributeDispatchV2 ---------------------------------------------------------------

_DISPATCH_V2 = (
    "npu_moe_distribute_dispatch_v2(Tensor? x, Tensor? expert_ids, str group_ep, "
    "int ep_world_size, int ep_rank_id, int moe_expert_num, *, Tensor? scales=None, "
    "Tensor? x_active_mask=None, Tensor? expert_scales=None, Tensor? elastic_info=None, "
    "Tensor(a!)? performance_info=None, str group_tp=\"\", int tp_world_size=0, "
    "int tp_rank_id=0, int expert_shard_type=0, int shared_expert_num=1, "
    "int shared_expert_rank_num=0, int quant_mode=0, int global_bs=0, "
    "int expert_token_nums_type=1, str comm_alg=\"\", int zero_expert_num=0, "
    "int copy_expert_num=0, int const_expert_num=0, int? y_dtype=None, int? x_dtype=None, "
    "int? scales_dtype=None) -> (Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor)")


@_define(_DISPATCH_V2)
def npu_moe_distribute_dispatch_v2(x, expert_ids, group_ep, ep_world_size, ep_rank_id,
                                   moe_expert_num, *, scales=None, x_active_mask=None,
                                   expert_scales=None, elastic_info=None, performance_info=None,
                                   group_tp="", tp_world_size=0, tp_rank_id=0,
                                   expert_shard_type=0, shared_expert_num=1,
                                   shared_expert_rank_num=0, quant_mode=0, global_bs=0,
                                   expert_token_nums_type=1, comm_alg="", zero_expert_num=0,
                                   copy_expert_num=0, const_expert_num=0, y_dtype=None,
                                   x_dtype=None, scales_dtype=None):
    """Returns (expand_x, dynamic_scales, assist_info_for_combine, expert_token_nums,
    ep_recv_counts, tp_recv_counts, expand_scales). x_dtype: the element type of an x that is
    already quantised (torch.int8, megamoe.float8_e4m3fn / float8_e5m2 for uint8 bytes) with
    quant_mode 0: the rows travel as they are and ``scales`` (their per-token fp32 [BS],
    per-group fp32 [BS, ceil(H/128)] or MX e8m0 [BS, align2(ceil(H/32))] scales;
    scales_dtype names the e8m0 bytes) arrive in dynamic_scales (docs/ops.md)."""
    a = _lib.default(_DispatchArgs)
    call = _Call()
    call.tensor(a.x, x, "x", _y_code(x_dtype))
    call.tensor(a.expert_ids, expert_ids, "expert_ids")
    call.tensor(a.scales, scales, "scales", _scales_code(scales_dtype, scales))
    call.tensor(a.x_active_mask, x_active_mask, "x_active_mask")
    call.tensor(a.expert_scales, expert_scales, "expert_scales")
    call.tensor(a.elastic_info, elastic_info, "elastic_info")
    perf = _perf(call, a.performance_info, performance_info)
    a.group_ep = _comm_handle(group_ep, "group_ep")
    a.group_tp = _comm_handle(group_tp, "group_tp")
    a.ep_world_size, a.ep_rank_id, a.moe_expert_num = ep_world_size, ep_rank_id, moe_expert_num
    a.tp_world_size, a.tp_rank_id = tp_world_size, tp_rank_id
    a.expert_shard_type, a.shared_expert_num = expert_shard_type, shared_expert_num
    a.shared_expert_rank_num, a.quant_mode, a.global_bs = shared_expert_rank_num, quant_mode, global_bs
    a.expert_token_nums_type = expert_token_nums_type
    alg = (comm_alg or "").encode()
    a.comm_alg = alg
    a.zero_expert_num, a.copy_expert_num = zero_expert_num, copy_expert_num
    a.const_expert_num = const_expert_num
    y = _y_code(y_dtype)
    if y is not None:
        a.expand_x.dtype = y
    # Shapes as torch_npu allocates them. When the arguments are invalid the call below still
    # runs (with empty outputs), so the error reaches every rank of the group together.
    infer = _L.megamoe_dispatch_v2_infer(ctypes.byref(a))
    names = ("expand_x", "dynamic_scales", "assist_info_for_combine", "expert_token_nums",
             "ep_recv_counts", "tp_recv_counts", "expand_scales")
    if infer != 0:
        for n in names:
            getattr(a, n).ndim = 1
            getattr(a, n).shape[0] = 0
    outs = [call.alloc(getattr(a, n)) for n in names]
    if infer != 0:
        for n in names:
            getattr(a, n).data = None  # the call reports infer's error, on every rank
    elif y is not None and a.expand_x.dtype != y:
        a.expand_x.dtype = y  # an expand_x type that does not fit quant_mode: rejected below
    call.run(_L.megamoe_dispatch_v2, a)
    _perf_back(call, performance_info, perf)
    return tuple(outs)


# ---- MoeDistributeCombineV2 ----------------------------------------------------------------

def _combine_args(a, call, expand_x, expert_ids, assist_info_for_combine, ep_send_counts,
                  expert_scales, group_ep, ep_world_size, ep_rank_id, moe_expert_num, kw):
    call.tensor(a.expand_x, expand_x, "expand_x")
    call.tensor(a.expert_ids, expert_ids, "expert_ids")
    call.tensor(a.assist_info_for_combine, assist_info_for_combine, "assist_info_for_combine")
    call.tensor(a.ep_send_counts, ep_send_counts, "ep_send_counts")
    call.tensor(a.expert_scales, expert_scales, "expert_scales")
    for n in ("tp_send_counts", "x_active_mask", "expand_scales", "shared_expert_x",
              "elastic_info", "ori_x", "const_expert_alpha_1", "const_expert_alpha_2",
              "const_expert_v", "activation_scale", "weight_scale", "group_list"):
        call.tensor(getattr(a, n), kw.get(n), n)
    a.group_ep = _comm_handle(group_ep, "group_ep")
    a.group_tp = _comm_handle(kw["group_tp"], "group_tp")
    a.ep_world_size, a.ep_rank_id, a.moe_expert_num = ep_world_size, ep_rank_id, moe_expert_num
    for n in ("tp_world_size", "tp_rank_id", "expert_shard_type", "shared_expert_num",
              "shared_expert_rank_num", "global_bs", "out_dtype", "comm_quant_mode",
              "group_list_type", "zero_expert_num", "copy_expert_num", "const_expert_num"):
        setattr(a, n, int(kw.get(n, 0)))
    alg = (kw.get("comm_alg") or "").encode()
    call.keep.append(alg)
    a.comm_alg = alg


_COMBINE_V2 = (
    "npu_moe_distribute_combine_v2(Tensor? expand_x, Tensor? expert_ids, "
    "Tensor? assist_info_for_combine, Tensor? ep_send_counts, Tensor? expert_scales, "
    "str group_ep, int ep_world_size, int ep_rank_id, int moe_expert_num, *, "
    "Tensor? tp_send_counts=None, Tensor? x_active_mask=None, Tensor? expand_scales=None, "
    "Tensor? shared_expert_x=None, Tensor? elastic_info=None, Tensor? ori_x=None, "
    "Tensor? const_expert_alpha_1=None, Tensor? const_expert_alpha_2=None, "
    "Tensor? const_expert_v=None, Tensor(a!)? performance_info=None, str group_tp=\"\", "
    "int tp_world_size=0, int tp_rank_id=0, int expert_shard_type=0, "
    "int shared_expert_num=1, int shared_expert_rank_num=0, int global_bs=0, "
    "int comm_quant_mode=0, str comm_alg=\"\", int zero_expert_num=0, "
    "int copy_expert_num=0, int const_expert_num=0) -> Tensor")


@_define(_COMBINE_V2)
def npu_moe_distribute_combine_v2(expand_x, expert_ids, assist_info_for_combine, ep_send_counts,
                                  expert_scales, group_ep, ep_world_size, ep_rank_id,
                                  moe_expert_num, *, tp_send_counts=None, x_active_mask=None,
                                  expand_scales=None, shared_expert_x=None, elastic_info=None,
                                  ori_x=None, const_expert_alpha_1=None,
                                  const_expert_alpha_2=None, const_expert_v=None,
                                  performance_info=None, group_tp="", tp_world_size=0,
                                  tp_rank_id=0, expert_shard_type=0, shared_expert_num=1,
                                  shared_expert_rank_num=0, global_bs=0, comm_quant_mode=0,
                                  comm_alg="", zero_expert_num=0, copy_expert_num=0,
                                  const_expert_num=0):
    """Returns x [BS, H] (dtype of expand_x)."""
    return _combine(dict(locals()))


def _combine(kw):
    """One CombineV2 call from keyword values (the reserved activation_scale, weight_scale,
    group_list, out_dtype and group_list_type too; the library checks them)."""
    a = _lib.default(_CombineArgs)
    call = _Call()
    _combine_args(a, call, kw["expand_x"], kw["expert_ids"], kw["assist_info_for_combine"],
                  kw["ep_send_counts"], kw["expert_scales"], kw["group_ep"], kw["ep_world_size"],
                  kw["ep_rank_id"], kw["moe_expert_num"], kw)
    performance_info = kw.get("performance_info")
    perf = _perf(call, a.performance_info, performance_info)
    if _L.megamoe_combine_v2_infer(ctypes.byref(a)) != 0:
        a.x.ndim, a.x.shape[0] = 1, 0  # invalid arguments: the call reports them on every rank
    x = call.alloc(a.x)
    call.run(_L.megamoe_combine_v2, a)
    _perf_back(call, performance_info, perf)
    return x


_COMBINE_ADD_RMS_NORM = (
    "npu_moe_distribute_combine_add_rms_norm(Tensor? expand_x, Tensor? expert_ids, "
    "Tensor? expand_idx, Tensor? ep_send_counts, Tensor? expert_scales, Tensor? residual_x, "
    "Tensor? gamma, str group_ep, int ep_world_size, int ep_rank_id, int moe_expert_num, *, "
    "Tensor? tp_send_counts=None, Tensor? x_active_mask=None, "
    "Tensor? activation_scale=None, Tensor? weight_scale=None, Tensor? group_list=None, "
    "Tensor? expand_scales=None, Tensor? shared_expert_x=None, Tensor? elastic_info=None, "
    "Tensor? ori_x=None, Tensor? const_expert_alpha_1=None, "
    "Tensor? const_expert_alpha_2=None, Tensor? const_expert_v=None, str group_tp=\"\", "
    "int tp_world_size=0, int tp_rank_id=0, int expert_shard_type=0, "
    "int shared_expert_num=1, int shared_expert_rank_num=0, int global_bs=0, "
    "int out_dtype=0, int comm_quant_mode=0, int group_list_type=0, str comm_alg=\"\", "
    "float norm_eps=1e-06, int zero_expert_num=0, int copy_expert_num=0, "
    "int const_expert_num=0) -> (Tensor, Tensor, Tensor)")


@_define(_COMBINE_ADD_RMS_NORM, normalize=dict(_NORMALIZE, expand_idx=lambda t: _v2_assist(t)))
def npu_moe_distribute_combine_add_rms_norm(expand_x, expert_ids, expand_idx, ep_send_counts,
                                            expert_scales, residual_x, gamma, group_ep,
                                            ep_world_size, ep_rank_id, moe_expert_num, *,
                                            tp_send_counts=None, x_active_mask=None,
                                            activation_scale=None, weight_scale=None,
                                            group_list=None, expand_scales=None,
                                            shared_expert_x=None, elastic_info=None, ori_x=None,
                                            const_expert_alpha_1=None, const_expert_alpha_2=None,
                                            const_expert_v=None, group_tp="", tp_world_size=0,
                                            tp_rank_id=0, expert_shard_type=0,
                                            shared_expert_num=1, shared_expert_rank_num=0,
                                            global_bs=0, out_dtype=0, comm_quant_mode=0,
                                            group_list_type=0, comm_alg="", norm_eps=1e-06,
                                            zero_expert_num=0, copy_expert_num=0,
                                            const_expert_num=0):
    """Combine, add residual_x, RMSNorm with gamma. Returns (y, rstd_out, x), all [BS, 1, *].
    comm_alg as in npu_moe_distribute_combine_v2 (it must match the dispatch's)."""
    kw = dict(locals())
    a = _lib.default(_AddRmsNormArgs)
    call = _Call()
    expand_idx = _v2_assist(expand_idx)  # a V1 dispatch's expand_idx works too
    _combine_args(a.combine, call, expand_x, expert_ids, expand_idx, ep_send_counts,
                  expert_scales, group_ep, ep_world_size, ep_rank_id, moe_expert_num, kw)
    call.tensor(a.residual_x, residual_x, "residual_x")
    call.tensor(a.gamma, gamma, "gamma")
    a.norm_eps = float(norm_eps)
    if _L.megamoe_combine_add_rms_norm_infer(ctypes.byref(a)) != 0:
        for t in (a.combine.x, a.y, a.rstd):
            t.ndim, t.shape[0] = 1, 0  # invalid arguments: the call reports them on every rank
    x = call.alloc(a.combine.x)
    y = call.alloc(a.y)
    rstd = call.alloc(a.rstd)
    call.run(_L.megamoe_combine_add_rms_norm, a)
    return y, rstd, x


# ---- V1 (npu_moe_distribute_dispatch / _combine): a mapping layer over V2, _ops_v1.py ------

_V2_ASSIST = "_megamoe_v2_assist"  # attribute of a V1 expand_idx: the V2 triples it stands for


def _v2_assist(t):
    """The V2 assist_info_for_combine a V1 expand_idx carries; anything else unchanged."""
    return getattr(t, _V2_ASSIST, t) if isinstance(t, torch.Tensor) else t


from ._ops_v1 import npu_moe_distribute_combine, npu_moe_distribute_dispatch  # noqa: E402

# torch_npu names without the npu_ prefix
moe_distribute_dispatch = npu_moe_distribute_dispatch
moe_distribute_combine = npu_moe_distribute_combine
moe_distribute_dispatch_v2 = npu_moe_distribute_dispatch_v2
moe_distribute_combine_v2 = npu_moe_distribute_combine_v2
moe_distribute_combine_add_rms_norm = npu_moe_distribute_combine_add_rms_norm

# ---- the serving MegaMoE (CANN's get_symm_buffer_for_mega_moe / mega_moe): serve.py ----------
from .serve import (SymmBuffer, float4_e2m1fn_x2, get_symm_buffer_for_mega_moe,  # noqa: E402
                    mega_moe)

__all__ += ["SymmBuffer", "get_symm_buffer_for_mega_moe", "mega_moe", "float4_e2m1fn_x2"]

# the C++ CPU kernels of the Torch adapter, when one is built for this torch (megamoe/_adapter.py)
_adapter.load([npu_moe_distribute_dispatch_v2, npu_moe_distribute_combine_v2,
               npu_moe_distribute_combine_add_rms_norm])

# ---- torch_npu's companion operators (grouped matmul, activations, quantisation, routing) ------
from .companion import (npu_dequant_swiglu_quant, npu_dynamic_quant,  # noqa: E402
                        npu_clipped_swiglu, npu_grouped_matmul, npu_grouped_matmul_swiglu_quant,
                        npu_grouped_matmul_swiglu_quant_v2, npu_swiglu)
from .companion_routing import (npu_moe_finalize_routing, npu_moe_gating_top_k,  # noqa: E402
                                npu_moe_init_routing_v2, npu_moe_token_permute,
                                npu_moe_token_unpermute, npu_moe_update_expert)
from . import companion as _companion  # noqa: E402

__all__ += list(_companion.OPERATORS)
