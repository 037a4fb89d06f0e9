"""ctypes declarations of the internal kernels entry points the kernels pytest files call.

These are internal (mm_) symbols of libmegamoe.so, not public API: only tests use them.
"""
import ctypes

import numpy as np

from megamoe import _lib

lib = _lib.lib
_vp, _i64, _int, _f32 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int, ctypes.c_float

FP32, BF16, FP16, E4M3, E5M2, INT8 = 0, 1, 2, 3, 4, 6

for name, args in {
    "mm_swiglu_fwd": [_i64, _i64, _vp, _i64, _vp, _i64, _f32],
    "mm_swiglu_bwd": [_i64, _i64, _vp, _i64, _vp, _i64, _vp, _i64, _f32],
    "mm_quant_static_int8": [_vp, _int, _i64, _vp, _i64, _vp],
    "mm_quant_dynamic_token": [_vp, _int, _i64, _vp, _int, _vp, _vp],
    "mm_quant_dynamic_group": [_vp, _int, _i64, _vp, _int, _vp, _vp],
    "mm_quant_mx": [_vp, _int, _i64, _int, _vp, _vp],
    "mm_comm_quant_int8": [_vp, _int, _i64, _vp, _vp],
    "mm_comm_dequant_int8": [_vp, _vp, _int, _i64, _vp],
}.items():
    getattr(lib, name).argtypes = args
    getattr(lib, name).restype = _int
lib.mm_kernels_set_vector.argtypes = [_int]
lib.mm_kernels_set_vector.restype = _int


def ptr(a):
    return None if a is None else a.ctypes.data


def ok(status):
    assert status == 0, lib.megamoe_last_error().decode()


class vector_mode:
    """Context manager: run the library's AVX-512 (True) or scalar (False) paths."""

    def __init__(self, enabled):
        self.enabled = enabled

    def __enter__(self):
        self.prev = lib.mm_kernels_set_vector(int(self.enabled))

    def __exit__(self, *exc):
        lib.mm_kernels_set_vector(self.prev)


def bf16_bits_to_f32(u16):
    return (np.asarray(u16, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)


def f32_to_bf16_bits(f):
    """fp32 -> bf16 round to nearest even; NaN keeps sign and top payload (quiet bit if empty)."""
    f = np.asarray(f, dtype=np.float32)
    u = f.reshape(-1).view(np.uint32).astype(np.uint64)
    nan = (u & np.uint64(0x7FFFFFFF)) > np.uint64(0x7F800000)
    r = ((u + np.uint64(0x7FFF) + ((u >> np.uint64(16)) & np.uint64(1))) >> np.uint64(16)).astype(np.uint16)
    t = (u >> np.uint64(16)).astype(np.uint16)
    t = np.where((t & np.uint16(0x7F)) == 0, t | np.uint16(0x40), t)
    return np.where(nan, t, r).astype(np.uint16).reshape(f.shape)
