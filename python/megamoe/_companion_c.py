"""ctypes mirrors of include/megamoe/companion.h and the marshalling the companion operators
share (megamoe/companion.py, megamoe/companion_routing.py).

Every struct starts with struct_size; the mirrors are filled from the library's *_default()
functions, so a field the library adds later keeps its default here."""
import ctypes

import torch

from . import _lib
from ._library import concrete as _concrete
from ._library import faking as _faking
from ._library import stand_in as _stand_in
from .errors import check

_L = _lib.lib
_vp = ctypes.c_void_p
_i64 = ctypes.c_int64

# megamoe_dtype_t codes (include/megamoe/dtype.h)
FP32, BF16, FP16, E4M3, E5M2, E8M0, INT8, UINT8, INT32, INT64, BOOL = range(11)
FROM_TORCH = {torch.float32: FP32, torch.bfloat16: BF16, torch.float16: FP16,
              torch.int8: INT8, torch.uint8: UINT8, torch.int32: INT32, torch.int64: INT64,
              torch.bool: BOOL}
FLOATS = (torch.float32, torch.bfloat16, torch.float16)


class Tensor(ctypes.Structure):  # megamoe_tensor_t (its registered mirror is megamoe.ops')
    _fields_ = [("data", _vp), ("dtype", ctypes.c_int), ("ndim", ctypes.c_int),
                ("shape", _i64 * 4)]


_T = Tensor


@_lib.mirror("megamoe_grouped_matmul_args_t")
class GroupedMatmulArgs(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_size_t), ("x", _T), ("weight", _T),
                ("weight_stride", _i64 * 3), ("weight_list", ctypes.POINTER(_vp)),
                ("bias", _T), ("scale", _T), ("per_token_scale", _T), ("antiquant_scale", _T),
                ("antiquant_offset", _T), ("group_list", _T), ("group_list_type", _i64),
                ("weight_int4", ctypes.c_int), ("y", _T), ("threads", ctypes.c_int),
                ("packed", ctypes.c_void_p)]


@_lib.mirror("megamoe_init_routing_args_t")
class InitRoutingArgs(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_size_t), ("x", _T), ("expert_idx", _T), ("scale", _T),
                ("offset", _T), ("active_num", _i64), ("expert_capacity", _i64),
                ("expert_num", _i64), ("drop_pad_mode", _i64), ("expert_tokens_num_type", _i64),
                ("expert_tokens_num_flag", ctypes.c_int), ("quant_mode", _i64),
                ("range_start", _i64), ("range_end", _i64), ("row_idx_type", _i64),
                ("expanded_x", _T), ("expanded_row_idx", _T), ("expert_tokens", _T),
                ("expanded_scale", _T), ("threads", ctypes.c_int)]


@_lib.mirror("megamoe_finalize_routing_args_t")
class FinalizeRoutingArgs(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_size_t), ("expanded_permuted_rows", _T),
                ("skip1", _T), ("skip2", _T), ("bias", _T), ("scales", _T),
                ("expanded_src_to_dst_row", _T), ("expert_for_source_row", _T),
                ("drop_pad_mode", _i64), ("k", _i64), ("out", _T), ("threads", ctypes.c_int)]


@_lib.mirror("megamoe_gating_top_k_args_t")
class GatingTopKArgs(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_size_t), ("x", _T), ("bias", _T), ("k", _i64),
                ("k_group", _i64), ("group_count", _i64), ("group_select_mode", _i64),
                ("renorm", _i64), ("norm_type", _i64), ("routed_scaling_factor", ctypes.c_double),
                ("eps", ctypes.c_double), ("y", _T), ("expert_idx", _T), ("norm_out", _T),
                ("threads", ctypes.c_int)]


@_lib.mirror("megamoe_swiglu_args_t")
class SwigluArgs(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_size_t), ("x", _T), ("dim", _i64),
                ("interleaved", ctypes.c_int), ("clipped", ctypes.c_int),
                ("alpha", ctypes.c_float), ("limit", ctypes.c_float), ("bias", ctypes.c_float),
                ("valid_rows", _i64), ("y", _T), ("threads", ctypes.c_int)]


@_lib.mirror("megamoe_dynamic_quant_args_t")
class DynamicQuantArgs(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_size_t), ("x", _T), ("smooth_scales", _T),
                ("group_index", _T), ("y", _T), ("scale", _T), ("threads", ctypes.c_int)]


@_lib.mirror("megamoe_dequant_swiglu_quant_args_t")
class DequantSwigluQuantArgs(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_size_t), ("x", _T), ("weight_scale", _T),
                ("activation_scale", _T), ("bias", _T), ("quant_scale", _T),
                ("quant_offset", _T), ("group_index", _T), ("group_index_type", _i64),
                ("activate_left", ctypes.c_int), ("quant_mode", _i64), ("swiglu_mode", _i64),
                ("clamp_limit", ctypes.c_float), ("glu_alpha", ctypes.c_float),
                ("glu_bias", ctypes.c_float), ("y", _T), ("scale", _T),
                ("threads", ctypes.c_int)]


_P = ctypes.POINTER
_ARGS = {}
for _name, _st in (("grouped_matmul", GroupedMatmulArgs), ("init_routing", InitRoutingArgs),
                   ("finalize_routing", FinalizeRoutingArgs), ("gating_top_k", GatingTopKArgs),
                   ("swiglu", SwigluArgs), ("dynamic_quant", DynamicQuantArgs),
                   ("dequant_swiglu_quant", DequantSwigluQuantArgs)):
    _f = getattr(_L, f"megamoe_{_name}")
    _f.restype, _f.argtypes = ctypes.c_int, [_P(_st)]
    _ARGS[_name] = _st
_L.megamoe_init_routing_infer.restype = ctypes.c_int
_L.megamoe_init_routing_infer.argtypes = [_P(InitRoutingArgs)]
_L.megamoe_swiglu_backward.restype = ctypes.c_int
_L.megamoe_swiglu_backward.argtypes = [_P(SwigluArgs), _P(_T), _P(_T)]
_L.megamoe_token_permute.restype = ctypes.c_int
_L.megamoe_token_permute.argtypes = [_P(_T), _P(_T), _i64, _P(_T), _P(_T), ctypes.c_int]
_L.megamoe_token_unpermute.restype = ctypes.c_int
_L.megamoe_token_unpermute.argtypes = [_P(_T), _P(_T), _P(_T), _P(_T), ctypes.c_int]
_L.megamoe_token_unpermute_backward.restype = ctypes.c_int
_L.megamoe_token_unpermute_backward.argtypes = [_P(_T)] * 6 + [ctypes.c_int]

_L.megamoe_gmm_weights_create.restype = ctypes.c_int
_L.megamoe_gmm_weights_create.argtypes = [_P(GroupedMatmulArgs), ctypes.c_uint64, _P(_vp)]
_L.megamoe_gmm_weights_update.restype = ctypes.c_int
_L.megamoe_gmm_weights_update.argtypes = [_vp, _P(GroupedMatmulArgs), ctypes.c_uint64,
                                          _P(ctypes.c_int)]
_L.megamoe_gmm_weights_bytes.restype = ctypes.c_size_t
_L.megamoe_gmm_weights_bytes.argtypes = [_vp]
_L.megamoe_gmm_weights_destroy.restype = None
_L.megamoe_gmm_weights_destroy.argtypes = [_vp]

lib = _L
_EMPTY = ctypes.create_string_buffer(64)  # the data pointer of present but empty tensors


def default(name):
    """A fresh args struct with the library's defaults (megamoe_<name>_args_default())."""
    return _lib.default(_ARGS[name])


def threads():
    """Threads a companion call may use: torch's own setting (torch.set_num_threads)."""
    return max(1, torch.get_num_threads())


class Call:
    """Describes torch tensors for one C call and keeps them alive until it returns. Inside a
    fake kernel (``_library.faking()``: FakeTensor / meta inputs) descriptors point at zeroed
    stand-ins of the right size (the C ``*_infer`` functions may read them) and ``run`` calls
    nothing: the body then only describes its outputs' shapes and dtypes."""

    def __init__(self, op):
        self.op = op
        self.keep = []
        self.fake = _faking()

    def cpu(self, t, name):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{self.op}: {name} must be a torch.Tensor, got {type(t).__name__}")
        if t.device.type != "cpu" and not self.fake:
            raise ValueError(f"{self.op}: {name} must be a CPU tensor (got device {t.device})")
        return t

    def desc(self, t, name, contiguous=True, code=None):
        """A megamoe_tensor_t of t (None: absent). Non-contiguous tensors are copied unless
        contiguous=False (the caller then passes strides)."""
        d = Tensor()
        if t is None:
            return d
        t = self.cpu(t, name)
        if t.dim() > 4:
            raise ValueError(f"{self.op}: {name} has {t.dim()} dims; at most 4 are supported")
        if self.fake:
            shape = [_concrete(n) for n in t.shape]
            numel = 1
            for n in shape:
                numel *= n
            buf = _stand_in(numel * t.element_size())
            self.keep.append(buf)
            d.data = ctypes.addressof(buf)
        else:
            if contiguous:
                t = t.contiguous()
            self.keep.append(t)
            shape = t.shape
            d.data = t.data_ptr() if t.numel() else ctypes.addressof(_EMPTY)
        d.dtype = FROM_TORCH.get(t.dtype, 99) if code is None else code
        d.ndim = len(shape)
        for i, n in enumerate(shape):
            d.shape[i] = n
        return d

    def out(self, t, name):
        return self.desc(t, name)

    def run(self, fn, *args):
        if self.fake:
            return
        check(fn(*[ctypes.byref(a) if isinstance(a, ctypes.Structure) else a for a in args]))
