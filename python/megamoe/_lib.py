"""Locate and load libmegamoe.so with ctypes, and declare the C signatures used by the package."""
import ctypes
import glob
import os

_HERE = os.path.dirname(os.path.abspath(__file__))
_REPO = os.path.abspath(os.path.join(_HERE, "..", ".."))
ABI_VERSION = 2
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


# ---- public structs (include/megamoe/version.h: the ABI scheme) ----------------------------
lib.megamoe_struct_size.restype = ctypes.c_int64
lib.megamoe_struct_size.argtypes = [c_char_p]
lib.megamoe_struct_min_size.restype = ctypes.c_int64
lib.megamoe_struct_min_size.argtypes = [c_char_p]

# C type name -> its ctypes mirror (tests/install/test_abi_layout.py compares every one field
# by field with the C layout).
MIRRORS = {}


def mirror(c_name):
    """Class decorator for the ctypes mirror of public struct c_name: registers it, and fails
    the import when its size is not the library's (a stale mirror or library would corrupt
    memory)."""
    def register(cls):
        size = lib.megamoe_struct_size(c_name.encode())
        if size != ctypes.sizeof(cls):
            raise ImportError(f"megamoe: the mirror {cls.__name__} of {c_name} is "
                              f"{ctypes.sizeof(cls)} bytes, {path} says {size}; the package and "
                              f"the library differ: rebuild with 'make build'")
        cls.c_name = c_name
        MIRRORS[c_name] = cls
        return cls
    return register


def default(cls):
    """An extensible struct with the library's defaults: megamoe_X_init(&v, sizeof v), the
    struct_size being the mirror's (what megamoe_X_default() does in C)."""
    v = cls()
    stem = cls.c_name[:-2]
    init = getattr(lib, f"{stem}_init")
    init.restype = c_int
    if cls.c_name == "megamoe_combine_add_rms_norm_args_t":
        st = init(ctypes.byref(v), ctypes.c_size_t(ctypes.sizeof(v)),
                  ctypes.c_size_t(ctypes.sizeof(v.combine)))
    else:
        st = init(ctypes.byref(v), ctypes.c_size_t(ctypes.sizeof(v)))
    if st != 0:
        raise RuntimeError(f"{stem}_init failed: {lib.megamoe_last_error().decode()}")
    return v


# ---- reference model (include/megamoe/reference.h) -----------------------------------------
@mirror("megamoe_reference_shape_t")
class ReferenceShape(ctypes.Structure):
    _fields_ = [("ep", ctypes.c_int64), ("tokens_per_rank", ctypes.c_int64),
                ("hidden", ctypes.c_int64), ("intermediate", ctypes.c_int64),
                ("num_experts", ctypes.c_int64), ("top_k", ctypes.c_int64)]


@mirror("megamoe_reference_params_t")
class ReferenceParams(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_size_t), ("swiglu_limit", ctypes.c_float), ("hidden_dtype", c_int), ("ids_dtype", c_int),
                ("probs_dtype", c_int), ("weight_dtype", c_int), ("grad_dtype", c_int),
                ("bf16_intermediates", c_int)]


_vp = ctypes.c_void_p
lib.megamoe_reference_forward.restype = c_int
lib.megamoe_reference_forward.argtypes = [ctypes.POINTER(ReferenceShape),
                                          ctypes.POINTER(ReferenceParams)] + [_vp] * 6
lib.megamoe_reference_backward.restype = c_int
lib.megamoe_reference_backward.argtypes = [ctypes.POINTER(ReferenceShape),
                                           ctypes.POINTER(ReferenceParams)] + [_vp] * 10
