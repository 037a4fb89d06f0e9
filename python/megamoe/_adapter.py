"""The optional Torch adapter: C++ CPU kernels for operators megamoe/_library.py defines.

``libmegamoe_torch-<major>.<minor>.so`` (src/torch/) is built per torch and named after the torch
it was built for. It defines nothing: after the Python registration defined ``torch.ops.megamoe``
it adds CPU kernels for the dispatch/combine operators (no Python on their call path), through
an ``extern "C"`` entry point, so a failure is an error message here, never an exception in a
library constructor. It is used only when it cannot hurt the process:

* its name matches the running torch (``torch.__version__``'s major.minor);
* every libtorch / libc10 library it needs is the one this process has loaded already (a
  Debian libtorch beside a pip torch would otherwise load a second libtorch);
* it resolved the very libmegamoe the binding loaded (one runtime per process) and has the
  binding's ABI.

Otherwise the Python bodies (ctypes) stay the CPU kernels, and ``import megamoe`` always works.
It is looked for next to the libmegamoe.so that ``_lib`` loaded (the wheel's ``megamoe/_native/``,
an installed ``lib/``, or the build tree's ``src/torch/``). ``MEGAMOE_TORCH_ADAPTER``: ``auto``
(default: use it when it fits, warn when one for this torch is present but unusable), ``on``
(ImportError when it cannot be used), ``off`` (never).
"""
import ctypes
import os
import re
import struct
import warnings

import torch

from . import _lib

__all__ = ["load", "path", "loaded", "register_group", "adapter_name", "needed_libraries"]

_MODES = ("auto", "on", "off")
path = None      # the adapter in use, or None
loaded = None    # its ctypes handle
_problems = []


def adapter_name(version=None):
    """File name of the adapter built for torch ``version`` (default: the running torch)."""
    major, minor = re.findall(r"\d+", version or torch.__version__)[:2]
    return f"libmegamoe_torch-{major}.{minor}.so"


def _candidates():
    here = os.path.dirname(_lib.path)
    if here:
        name = adapter_name()
        yield os.path.join(here, name)            # wheel payload, installed lib/
        yield os.path.join(here, "torch", name)   # build tree: <build>/src/torch/


def needed_libraries(elf_path):
    """DT_NEEDED entries of a 64-bit little-endian ELF shared object (the libraries the dynamic
    loader will bring in), read without loading it."""
    with open(elf_path, "rb") as f:
        data = f.read()
    if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        raise OSError(f"{elf_path}: not a 64-bit little-endian ELF file")
    phoff, = struct.unpack_from("<Q", data, 0x20)
    phentsize, phnum = struct.unpack_from("<HH", data, 0x36)
    loads, dynamic = [], None
    for i in range(phnum):
        p_type, _, p_offset, p_vaddr, _, p_filesz, _, _ = struct.unpack_from(
            "<IIQQQQQQ", data, phoff + i * phentsize)
        if p_type == 1:
            loads.append((p_vaddr, p_offset, p_filesz))
        elif p_type == 2:
            dynamic = (p_offset, p_filesz)
    if dynamic is None:
        return []

    def offset(vaddr):
        for v, o, n in loads:
            if v <= vaddr < v + n:
                return o + vaddr - v
        raise OSError(f"{elf_path}: address {vaddr:#x} is in no loaded segment")

    needed, strtab = [], None
    for i in range(dynamic[1] // 16):
        tag, val = struct.unpack_from("<qQ", data, dynamic[0] + 16 * i)
        if tag == 0:
            break
        if tag == 1:
            needed.append(val)
        elif tag == 5:
            strtab = offset(val)
    if strtab is None:
        return []
    return [data[strtab + n:data.index(b"\0", strtab + n)].decode() for n in needed]


def _already_loaded(name):
    try:
        ctypes.CDLL(name, mode=os.RTLD_NOLOAD | os.RTLD_LAZY)
        return True
    except OSError:
        return False


def _try(candidate):
    """Load one adapter file; returns the ctypes handle, or raises OSError naming the problem."""
    foreign = [n for n in needed_libraries(candidate)
               if n.startswith(("libtorch", "libc10")) and not _already_loaded(n)]
    if foreign:
        raise OSError(f"built against another libtorch than this process's torch "
                      f"{torch.__version__} (would load {', '.join(foreign)})")
    handle = ctypes.CDLL(candidate, mode=ctypes.RTLD_LOCAL)
    handle.megamoe_torch_adapter_library_id.restype = ctypes.c_void_p
    handle.megamoe_torch_adapter_abi.restype = ctypes.c_int
    handle.megamoe_torch_adapter_register.restype = ctypes.c_char_p
    handle.megamoe_torch_adapter_register.argtypes = []
    handle.megamoe_torch_adapter_kernels.restype = ctypes.c_char_p
    handle.megamoe_torch_adapter_kernels.argtypes = []
    handle.megamoe_torch_adapter_set_group.restype = None
    handle.megamoe_torch_adapter_set_group.argtypes = [ctypes.c_char_p, ctypes.c_void_p]
    mine = ctypes.cast(_lib.lib.megamoe_version, ctypes.c_void_p).value
    if handle.megamoe_torch_adapter_library_id() != mine:
        raise OSError(f"resolved another libmegamoe than {_lib.path}")
    if handle.megamoe_torch_adapter_abi() != _lib.ABI_VERSION:
        raise OSError(f"ABI {handle.megamoe_torch_adapter_abi()}, the binding has "
                      f"{_lib.ABI_VERSION}")
    return handle


def load(operators):
    """Give ``operators`` (megamoe._library Operators) the adapter's CPU kernels where it has
    them. Called once, after the operators are defined (megamoe/ops.py)."""
    global path, loaded
    text = os.environ.get("MEGAMOE_TORCH_ADAPTER", "")
    mode = text.lower() or "auto"
    if mode not in _MODES:
        raise ImportError(f"MEGAMOE_TORCH_ADAPTER='{text}' is not accepted; use one of "
                          f"{'|'.join(_MODES)}")
    if mode == "off" or loaded is not None:
        return
    for candidate in _candidates():
        if not os.path.exists(candidate):
            _problems.append(f"{candidate}: not found")
            continue
        try:
            handle = _try(candidate)
            kernels = set(handle.megamoe_torch_adapter_kernels().decode().split(","))
            unknown = kernels - {op.space.kernel_name(op.name) for op in operators}
            if unknown:
                raise OSError(f"kernels for operators megamoe does not define: {sorted(unknown)}")
            error = handle.megamoe_torch_adapter_register()
            if error:
                raise OSError(error.decode())
        except Exception as exc:  # noqa: BLE001 - never able to break `import megamoe`
            _problems.append(f"{candidate}: {exc}")
            continue
        path, loaded = candidate, handle
        for op in operators:
            op.adapter_kernel = op.space.kernel_name(op.name) in kernels
        from . import comm  # groups created before the adapter came
        for name, c in list(comm._by_name.items()):
            if c.alive:
                register_group(name, c.handle.value)
        return
    message = (f"megamoe: the Torch adapter for torch {torch.__version__} ({adapter_name()}) "
               "cannot be used; the operators run their Python bodies. Rebuild it for this torch "
               "('make build' with libtorch-dev) or set MEGAMOE_TORCH_ADAPTER=off.\n  "
               + "\n  ".join(_problems))
    if mode == "on":
        raise ImportError(message)
    if any("not found" not in p for p in _problems):
        warnings.warn(message, RuntimeWarning, stacklevel=3)  # present but unusable


def register_group(name, handle):
    """megamoe.comm names its communicators; the adapter's kernels resolve group_ep/group_tp by
    name (handle None/0: the communicator is gone)."""
    if loaded is not None:
        loaded.megamoe_torch_adapter_set_group(name.encode(), handle or None)
