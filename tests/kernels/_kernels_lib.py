"""ctypes declarations of the internal kernels entry points the kernels pytest files call.

These are internal (mm_) functions, not public API: libmegamoe.so does not export them, so they
come from the test-only libmegamoe_kernels_test.so (tests/kernels/kernels_test_api.c), which
re-exports each as mmt_<name>; ``lib.mm_<name>`` below is that function.
"""
import ctypes
import os
import types

import numpy as np

_REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
_BUILD = os.environ.get("MEGAMOE_BUILD_DIR") or os.path.join(_REPO, "build", "release")
_SHIM = os.path.join(_BUILD, "tests", "kernels", "libmegamoe_kernels_test.so")
if not os.path.exists(_SHIM):
    raise ImportError(f"{_SHIM} not built; run 'make build'")
_shim = ctypes.CDLL(_SHIM)

_vp, _i64, _int, _f32 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int, ctypes.c_float

FP32, BF16, FP16, E4M3, E5M2, INT8, INT32 = 0, 1, 2, 3, 4, 6, 8

lib = types.SimpleNamespace()
for name, args in {
    "mm_swiglu_fwd": [_i64, _i64, _vp, _i64, _vp, _i64, _f32],
    "mm_swiglu_bwd": [_i64, _i64, _vp, _i64, _vp, _i64, _vp, _i64, _f32],
    "mm_quant_static_int8": [_vp, _int, _i64, _vp, _i64, _vp],
    "mm_quant_dynamic_token": [_vp, _int, _i64, _vp, _int, _vp, _vp],
    "mm_quant_dynamic_group": [_vp, _int, _i64, _vp, _int, _vp, _vp],
    "mm_quant_mx": [_vp, _int, _i64, _int, _vp, _vp],
    "mm_comm_quant_int8": [_vp, _int, _i64, _vp, _vp],
    "mm_comm_dequant_int8": [_vp, _vp, _int, _i64, _vp],
    "mm_kernels_set_vector": [_int],
    "mm_quant_rows_int8": [_int, _vp, _int, _i64, _i64, _i64, _vp, _vp, _i64, _vp],
    "mm_qgemm_grouped": [_int, _int, _i64, _i64, _i64, _vp, _i64, _i64, _int, _vp, _int, _vp,
                         _vp, _i64, _vp, _vp, _vp, _vp, _vp, _vp, _vp, _int],
}.items():
    fn = getattr(_shim, "mmt_" + name[len("mm_"):])
    fn.argtypes = args
    fn.restype = _int
    setattr(lib, name, fn)
_shim.mmt_last_error.restype = ctypes.c_char_p
_shim.mmt_last_error.argtypes = []
lib.megamoe_last_error = _shim.mmt_last_error


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
