"""Locate and load libmegamoe.so with ctypes, and declare the C signatures used by the package."""
import ctypes
import glob
import os

_HERE = os.path.dirname(os.path.abspath(__file__))
_REPO = os.path.abspath(os.path.join(_HERE, "..", ".."))
ABI_VERSION = 1
# The installed package (the wheel) carries its own library here, under its SONAME.
NATIVE_DIR = os.path.join(_HERE, "_native")
_PACKAGED = os.path.join(NATIVE_DIR, f"libmegamoe.so.{ABI_VERSION}")


def _candidates():
    if os.path.exists(_PACKAGED):
        # installed: always the payload the package was built with (its Torch adapter and CLI
        # belong to it); MEGAMOE_LIB / MEGAMOE_BUILD_DIR are for a source checkout
        yield _PACKAGED
        return
    env = os.environ.get("MEGAMOE_LIB")
    if env:
        yield env
        return
    build = os.environ.get("MEGAMOE_BUILD_DIR")
    if build:
        yield os.path.join(build, "src", "libmegamoe.so")
    for preset in ("release", "debug", "asan", "tsan"):
        yield os.path.join(_REPO, "build", preset, "src", "libmegamoe.so")
    yield from sorted(glob.glob(os.path.join(_REPO, "build", "*", "src", "libmegamoe.so")))
    yield f"libmegamoe.so.{ABI_VERSION}"  # a `cmake --install` on the loader's path


def _load():
    errors = []
    for path in _candidates():
        if os.path.sep in path and not os.path.exists(path):
            errors.append(f"{path}: not found")
            continue
        try:
            return ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL), path
        except OSError as exc:  # pragma: no cover - depends on the machine
            errors.append(f"{path}: {exc}")
    raise ImportError(
        "megamoe: cannot load libmegamoe.so; build it with 'make build' (or 'pip install .') "
        "or set MEGAMOE_LIB.\n  "
        + "\n  ".join(errors))


lib, path = _load()

c_int = ctypes.c_int
c_char_p = ctypes.c_char_p

lib.megamoe_version.restype = c_char_p
lib.megamoe_version.argtypes = []
lib.megamoe_abi_version.restype = c_int
lib.megamoe_status_str.restype = c_char_p
lib.megamoe_status_str.argtypes = [c_int]
lib.megamoe_status_name.restype = c_char_p
lib.megamoe_status_name.argtypes = [c_int]
lib.megamoe_last_error.restype = c_char_p
lib.megamoe_last_error.argtypes = []
lib.megamoe_clear_last_error.restype = None
lib.megamoe_fp32_to_bf16.restype = ctypes.c_uint16
lib.megamoe_fp32_to_bf16.argtypes = [ctypes.c_float]
lib.megamoe_convert.restype = c_int
lib.megamoe_convert.argtypes = [ctypes.c_void_p, c_int, ctypes.c_void_p, c_int, ctypes.c_size_t]

if lib.megamoe_abi_version() != ABI_VERSION:
    raise ImportError(f"megamoe: {path} has ABI {lib.megamoe_abi_version()}, "
                      f"this binding needs {ABI_VERSION}; rebuild with 'make build'")


# ---- reference model (include/megamoe/reference.h) -----------------------------------------
class ReferenceShape(ctypes.Structure):
    _fields_ = [("ep", ctypes.c_int64), ("tokens_per_rank", ctypes.c_int64),
                ("hidden", ctypes.c_int64), ("intermediate", ctypes.c_int64),
                ("num_experts", ctypes.c_int64), ("top_k", ctypes.c_int64)]


class ReferenceParams(ctypes.Structure):
    _fields_ = [("swiglu_limit", ctypes.c_float), ("hidden_dtype", c_int), ("ids_dtype", c_int),
                ("probs_dtype", c_int), ("weight_dtype", c_int), ("grad_dtype", c_int),
                ("bf16_intermediates", c_int)]


_vp = ctypes.c_void_p
lib.megamoe_reference_params_default.restype = ReferenceParams
lib.megamoe_reference_params_default.argtypes = []
lib.megamoe_reference_forward.restype = c_int
lib.megamoe_reference_forward.argtypes = [ctypes.POINTER(ReferenceShape),
                                          ctypes.POINTER(ReferenceParams)] + [_vp] * 6
lib.megamoe_reference_backward.restype = c_int
lib.megamoe_reference_backward.argtypes = [ctypes.POINTER(ReferenceShape),
                                           ctypes.POINTER(ReferenceParams)] + [_vp] * 10
