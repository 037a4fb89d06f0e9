"""Symmetric tensors and one-sided operations over megamoe's runtime, with HyperParallel's
``hyper_parallel.core.multicore.shmem`` API (that module re-exports this one):

    from hyper_parallel.core.multicore import shmem
    shmem.acquire()                               # a reference on the runtime (collective first)
    buf = shmem.empty(4, 1024, dtype=torch.bfloat16)
    sig = shmem.empty(16, dtype=torch.int32)      # a signal per 64-byte line
    shmem.put(buf[peer_slot], local_rows, target_pe=peer)
    shmem.signal(sig[0:1], 1, target_pe=peer, operation="add")
    shmem.wait_signal(sig[0:1], 1, comparison="ge")
    shmem.barrier(); shmem.free(buf); shmem.free(sig); shmem.release()

On a CPU a "PE" is a rank of the root group (a process), a symmetric tensor lives in the heap
every rank maps (same-host peers are written directly, other hosts through the inter-host
engine), and every call is host-synchronous: ``put`` returns with the source reusable, ``get``
with the data there, ``barrier`` and ``all_gather`` with every rank through (``blocking`` is
accepted and changes nothing: there is no device stream). Differences to the NPU runtime and
the rules: docs/shmem.md "Python shmem module".
"""
import ctypes
import operator
import os
import sys
import threading
import traceback
from collections.abc import Sequence
from datetime import datetime

import torch

from . import _lib
from . import comm as _comm
from .errors import MegaMoeError, check

__all__ = ["acquire", "release", "empty", "free", "put", "get", "signal", "wait_signal",
           "barrier", "host_barrier", "all_gather", "debug_state"]

_L = _lib.lib
_vp, _sz = ctypes.c_void_p, ctypes.c_size_t
_L.megamoe_symm_malloc.argtypes = [_vp, _sz, _sz, ctypes.POINTER(_vp)]
_L.megamoe_symm_free.argtypes = [_vp, _vp]
_L.megamoe_symm_put.argtypes = [_vp, _vp, _vp, _sz, ctypes.c_int]
_L.megamoe_symm_get.argtypes = [_vp, _vp, _vp, _sz, ctypes.c_int]
_L.megamoe_symm_signal_i32.argtypes = [_vp, _vp, ctypes.c_int32, ctypes.c_int, ctypes.c_int]
_L.megamoe_symm_wait_i32.argtypes = [_vp, _vp, ctypes.c_int, ctypes.c_int32]
_L.megamoe_symm_quiet.argtypes = [_vp]
_L.megamoe_symm_all_gather.argtypes = [_vp, _vp, _vp, _sz]
for _f in ("malloc", "free", "put", "get", "signal_i32", "wait_i32", "quiet", "all_gather"):
    getattr(_L, "megamoe_symm_" + _f).restype = ctypes.c_int


@_lib.mirror("megamoe_symm_state_t")
class _State(ctypes.Structure):
    _fields_ = [("running", ctypes.c_int), ("refcount", ctypes.c_int), ("rank", ctypes.c_int),
                ("world_size", ctypes.c_int), ("heap_size", ctypes.c_uint64),
                ("bytes_used", ctypes.c_uint64), ("bytes_peak", ctypes.c_uint64),
                ("live_allocations", ctypes.c_int), ("timeout_sec", ctypes.c_int),
                ("engine", ctypes.c_char * 96)]


_L.megamoe_symm_state_sized.argtypes = [ctypes.POINTER(_State), ctypes.c_size_t]
_L.megamoe_symm_state_sized.restype = ctypes.c_int

_lock = threading.RLock()
_users = 0
_chain = None          # the communicators acquire() holds (megamoe.comm._acquire)
_root = None           # the megamoe communicator of the root group
_root_group = None
_allocs = {}           # base address -> (bytes, allocation id, shape, dtype)
_next_id = [0]
_max_active = [0]
_last_failure = None
_OPS = {"set": 0, "add": 1}
_CMP = {"eq": 0, "ne": 1, "gt": 2, "ge": 3, "lt": 4, "le": 5}


def _fail(exc):
    """Remember the latest failure for debug_state and raise it as RuntimeError (upstream's
    error type); MegaMoeError is a RuntimeError already."""
    global _last_failure
    _last_failure = f"{type(exc).__name__}: {exc}"
    raise exc


def _require():
    if _users <= 0 or _root is None:
        _fail(RuntimeError("no SHMEM reference is active: call shmem.acquire() first"))
    return _root


# ---- lifecycle ---------------------------------------------------------------------------------

def _ranks(group):
    """Ordered global ranks of a root group ("world" for the world)."""
    return "world" if _comm._is_world(group) else tuple(_comm._group_ranks(group))


def acquire(root_group=None, *, heap_size_bytes=None):
    """Take one reference on the process-wide runtime; the first starts it over ``root_group``
    (None: torch.distributed's WORLD when initialised, else the RANK/WORLD_SIZE job). Later
    references must name the same ordered group. ``heap_size_bytes``: the per-rank heap when
    this call starts the runtime (else HYPER_PARALLEL_SHMEM_HEAP_SIZE); a running runtime
    with a smaller heap is an error."""
    global _users, _chain, _root, _root_group
    with _lock:
        if heap_size_bytes is not None and (isinstance(heap_size_bytes, bool) or
                                            not isinstance(heap_size_bytes, int) or
                                            heap_size_bytes <= 0):
            _fail(ValueError("heap_size_bytes must be a positive integer"))
        if _users > 0:
            if root_group is not _root_group and _ranks(root_group) != _ranks(_root_group):
                _fail(RuntimeError("the SHMEM root group differs from the active runtime's "
                                   "(one ordered membership per process)"))
            if heap_size_bytes is not None and _state().heap_size < heap_size_bytes:
                _fail(RuntimeError(f"the active SHMEM heap ({_state().heap_size} bytes) is "
                                   f"smaller than the requested {heap_size_bytes} bytes"))
            _users += 1
            return
        try:
            chain = _comm._acquire(root_group, heap_size=heap_size_bytes or 0)
        except MegaMoeError as exc:
            _fail(exc)
        if heap_size_bytes is not None and _state().heap_size < heap_size_bytes:
            _comm._release(chain)
            _fail(RuntimeError(f"the SHMEM runtime was already started with a "
                               f"{_state().heap_size}-byte heap, smaller than the requested "
                               f"{heap_size_bytes} bytes"))
        _chain, _root, _root_group, _users = chain, chain[-1], root_group, 1


def release():
    """Drop one reference; the last one (collective: every rank, same order) ends this
    module's use of the runtime, which stops when nothing else uses it. Every tensor of
    ``empty`` must have been freed."""
    global _users, _chain, _root, _root_group
    with _lock:
        if _users <= 0:
            _fail(RuntimeError("SHMEM runtime has no active reference to release"))
        if _users > 1:
            _users -= 1
            return
        if _allocs:
            _fail(RuntimeError(f"release with {len(_allocs)} live allocation(s): free() them "
                               "first (debug_state() lists them)"))
        check(_L.megamoe_symm_quiet(_root.handle))
        _root.barrier()
        chain = _chain
        _users, _chain, _root, _root_group = 0, None, None, None
        _comm._release(chain)


# ---- allocation ---------------------------------------------------------------------------------

def _normalize_size(size):
    shape = size[0] if len(size) == 1 and isinstance(size[0], Sequence) and \
        not isinstance(size[0], (str, bytes)) else size
    out = []
    for i, d in enumerate(shape):
        if isinstance(d, bool):
            raise TypeError(f"size[{i}] must be an integer, got bool")
        try:
            out.append(operator.index(d))
        except TypeError as exc:
            raise TypeError(f"size[{i}] must be an integer, got {type(d).__name__}") from exc
        if out[-1] < 0:
            raise ValueError(f"size[{i}] must be >= 0, got {out[-1]}")
    return tuple(out)


def empty(*size, dtype=None, alignment=None):
    """Collectively allocate a contiguous symmetric tensor (zeroed) of ``size`` (torch-style
    varargs or one sequence); free it with :func:`free` on every rank in the same order."""
    root = _require()
    shape = _normalize_size(size)
    dtype = torch.get_default_dtype() if dtype is None else dtype
    if alignment is not None:
        if isinstance(alignment, bool):
            raise TypeError("alignment must be an integer, got bool")
        alignment = operator.index(alignment)
    n = 1
    for d in shape:
        n *= d
    nbytes = n * torch.empty(0, dtype=dtype).element_size()
    ptr = ctypes.c_void_p()
    try:
        check(_L.megamoe_symm_malloc(root.handle, max(nbytes, 1), alignment or 0,
                                     ctypes.byref(ptr)))
    except MegaMoeError as exc:
        _fail(exc)
    buf = (ctypes.c_byte * max(nbytes, 1)).from_address(ptr.value)
    t = torch.frombuffer(buf, dtype=torch.uint8)[:nbytes].view(dtype).reshape(shape)
    with _lock:
        _next_id[0] += 1
        _allocs[ptr.value] = (nbytes, _next_id[0], shape, dtype)
        _max_active[0] = max(_max_active[0], len(_allocs))
    if os.environ.get("HYPER_PARALLEL_SHMEM_LOG_LEVEL") == "0":
        _log_site(ptr.value, nbytes, shape, dtype)
    return t


def _log_site(base, nbytes, shape, dtype):
    """One DEBUG line naming the caller of empty(), to trace a leaked allocation."""
    here = os.path.dirname(os.path.abspath(__file__))
    frame = next((f for f in reversed(traceback.extract_stack()[:-2])
                  if not os.path.abspath(f.filename).startswith(here)), None)
    site = f"{frame.filename}:{frame.lineno} in {frame.name}" if frame else "unknown"
    print(f"[HP-SHMEM][rank {_state().rank}][DEBUG] {datetime.now():%Y-%m-%d-%H:%M:%S} "
          f"op=Empty allocation_base={hex(base)} bytes={nbytes} shape={tuple(shape)} "
          f"dtype={dtype} callsite={site}", file=sys.stderr, flush=True)


def _alloc_of(t, what):
    """(base, bytes) of the live allocation holding tensor t's bytes; ValueError otherwise."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{what} must be a torch.Tensor, got {type(t).__name__}")
    if t.device.type != "cpu":
        raise ValueError(f"{what} must be a CPU tensor")
    p, n = t.data_ptr(), t.numel() * t.element_size()
    with _lock:
        for base, (size, *_rest) in _allocs.items():
            if base <= p and p + n <= base + max(size, 1):
                return base, size
    raise ValueError(f"{what} is not (inside) a live symmetric tensor of shmem.empty() (never "
                     "allocated there, or already freed)")


def free(tensor):
    """Collectively release a whole tensor of :func:`empty` (views cannot be freed alone).
    Later SHMEM operations on it are refused; plain torch use of it is not guarded."""
    root = _require()
    base, size = _alloc_of(tensor, "tensor")
    if tensor.data_ptr() != base or tensor.numel() * tensor.element_size() != size:
        _fail(ValueError("free() takes the complete tensor returned by empty(), not a view"))
    try:
        check(_L.megamoe_symm_free(root.handle, base))
    except MegaMoeError as exc:
        _fail(exc)
    with _lock:
        _allocs.pop(base, None)


# ---- one-sided data movement ----------------------------------------------------------------------

def _pe(pe, what):
    if isinstance(pe, bool):
        raise TypeError(f"{what} must be an integer, got bool")
    return operator.index(pe)


def _contiguous(t, what):
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{what} must be a torch.Tensor, got {type(t).__name__}")
    if not t.is_contiguous():
        raise ValueError(f"{what} must be contiguous")
    if t.device.type != "cpu":
        raise ValueError(f"{what} must be a CPU tensor")


def put(remote_dst, local_src, target_pe):
    """Copy local_src's bytes into target_pe's copy of the symmetric remote_dst (same byte
    count). Returns with local_src reusable; visible at the target after a later signal,
    barrier or quiet of this rank."""
    root = _require()
    _contiguous(remote_dst, "remote_dst")
    _contiguous(local_src, "local_src")
    _alloc_of(remote_dst, "remote_dst")
    n = remote_dst.numel() * remote_dst.element_size()
    if local_src.numel() * local_src.element_size() != n:
        _fail(ValueError(f"put: local_src has {local_src.numel() * local_src.element_size()} "
                         f"bytes, remote_dst {n}"))
    try:
        check(_L.megamoe_symm_put(root.handle, remote_dst.data_ptr(), local_src.data_ptr(), n,
                                  _pe(target_pe, "target_pe")))
    except MegaMoeError as exc:
        _fail(exc)


def get(local_dst, remote_src, source_pe):
    """Copy source_pe's copy of the symmetric remote_src into local_dst (same byte count);
    complete on return."""
    root = _require()
    _contiguous(local_dst, "local_dst")
    _contiguous(remote_src, "remote_src")
    _alloc_of(remote_src, "remote_src")
    n = remote_src.numel() * remote_src.element_size()
    if local_dst.numel() * local_dst.element_size() != n:
        _fail(ValueError(f"get: local_dst has {local_dst.numel() * local_dst.element_size()} "
                         f"bytes, remote_src {n}"))
    try:
        check(_L.megamoe_symm_get(root.handle, local_dst.data_ptr(), remote_src.data_ptr(), n,
                                  _pe(source_pe, "source_pe")))
    except MegaMoeError as exc:
        _fail(exc)


def _signal_elem(t, what):
    _contiguous(t, what)
    _alloc_of(t, what)
    if t.dtype != torch.int32 or t.numel() != 1:
        _fail(ValueError(f"{what} must be a view of one int32 element of a symmetric tensor"))


def _i32(value):
    if isinstance(value, bool):
        raise TypeError("value must be an integer, got bool")
    v = operator.index(value)
    if not -2 ** 31 <= v < 2 ** 31:
        _fail(ValueError(f"value {v} does not fit a signed 32-bit signal"))
    return v


def signal(remote_signal, value, target_pe, *, operation="set"):
    """Set or add ``value`` on target_pe's copy of an int32 signal, after this rank's earlier
    puts to target_pe (a waiter that sees the value sees the data). Concurrently updated
    signals belong on separate 64-byte lines."""
    root = _require()
    _signal_elem(remote_signal, "remote_signal")
    if operation not in _OPS:
        _fail(ValueError(f"operation must be exactly 'set' or 'add', got {operation!r}"))
    try:
        check(_L.megamoe_symm_signal_i32(root.handle, remote_signal.data_ptr(), _i32(value),
                                         _OPS[operation], _pe(target_pe, "target_pe")))
    except MegaMoeError as exc:
        _fail(exc)


def wait_signal(signal_tensor, value, *, comparison="eq"):
    """Wait until this rank's int32 signal compares true with value ("eq", "ne", "gt", "ge",
    "lt", "le"); TIMEOUT after HYPER_PARALLEL_SHMEM_TIMEOUT_SEC, PEER_LOST if a peer dies."""
    root = _require()
    _signal_elem(signal_tensor, "signal_tensor")
    if comparison not in _CMP:
        _fail(ValueError(f"comparison must be one of eq, ne, gt, ge, lt, le; got {comparison!r}"))
    try:
        check(_L.megamoe_symm_wait_i32(root.handle, signal_tensor.data_ptr(), _CMP[comparison],
                                       _i32(value)))
    except MegaMoeError as exc:
        _fail(exc)


def barrier(*, blocking=True):
    """Every rank of the root group arrives, and every put issued before is complete.
    ``blocking`` is accepted (there is no device stream: the call is always host-synchronous)."""
    root = _require()
    if not isinstance(blocking, bool):
        raise TypeError("blocking must be a bool")
    try:
        check(_L.megamoe_symm_quiet(root.handle))
        root.barrier()
    except MegaMoeError as exc:
        _fail(exc)


def host_barrier():
    """The same as :func:`barrier` on a CPU (HyperParallel's host-synchronous barrier)."""
    barrier()


def all_gather(output, input_tensor=None, **kw):
    """Rank r's ``input`` bytes land at slot r of the symmetric ``output`` (input.numel() *
    root size elements) on every rank; returns after all arrived (an exit barrier). A
    zero-byte input is a no-op. The input is passed positionally or as ``input=`` /
    ``input_tensor=`` (both upstream spellings)."""
    root = _require()
    if input_tensor is None:
        input_tensor = kw.pop("input", None)
    if kw:
        raise TypeError(f"all_gather() got an unexpected keyword argument {next(iter(kw))!r}")
    _contiguous(output, "output")
    _contiguous(input_tensor, "input")
    n = input_tensor.numel() * input_tensor.element_size()
    if n == 0:
        return
    _alloc_of(output, "output")
    if output.numel() * output.element_size() != n * root.size:
        _fail(ValueError(f"all_gather: output must hold input.numel() * {root.size} elements"))
    try:
        check(_L.megamoe_symm_all_gather(root.handle, output.data_ptr(), input_tensor.data_ptr(),
                                         n))
    except MegaMoeError as exc:
        _fail(exc)


# ---- diagnostics ---------------------------------------------------------------------------------

def _state():
    s = _State()
    check(_L.megamoe_symm_state_sized(ctypes.byref(s), ctypes.sizeof(s)))
    return s


class _DebugState(dict):
    """debug_state()'s dict; its repr prints one field per line."""

    def __repr__(self):
        def lines(d, pad=""):
            out = []
            for k, v in d.items():
                if isinstance(v, dict):
                    out += [f"{pad}{k}:"] + lines(v, pad + "  ")
                elif isinstance(v, list) and v and all(isinstance(i, dict) for i in v):
                    out.append(f"{pad}{k}:")
                    out += [pad + "  - " + ", ".join(
                        f"{f}={hex(x) if f == 'allocation_base' else x}" for f, x in i.items())
                        for i in v]
                else:
                    out.append(f"{pad}{k}: {v}")
            return out
        return "\n".join(lines(self))


def debug_state():
    """A local snapshot: state, reference_count, root, config, heap use, the live allocations
    and the latest failure. Needs no reference."""
    s = _state()
    d = _DebugState()
    ready = bool(s.running) and _users > 0
    d["state"] = "Ready" if ready else "Uninitialized"
    d["reference_count"] = _users
    if not ready:
        for k in ("root", "config", "allocated_bytes", "remaining_bytes", "active_allocations",
                  "max_active_allocations", "latest_failure"):
            d[k] = None
        return d
    allocated = sum(v[0] for v in _allocs.values())
    d["root"] = {"rank": _root.rank, "size": _root.size, "world_ranks": list(_root.world_ranks)}
    d["config"] = {"heap_size_bytes": int(s.heap_size), "timeout_seconds": s.timeout_sec,
                   "data_engine": s.engine.decode() or "none",
                   "bootstrap_endpoint_base": os.environ.get(
                       "HYPER_PARALLEL_SHMEM_BOOTSTRAP_ENDPOINT", "tcp://127.0.0.1:8662")}
    d["allocated_bytes"] = allocated
    d["remaining_bytes"] = int(s.heap_size) - allocated
    d["heap_bytes_in_use"] = int(s.bytes_used)  # everything in the heap (operator workspaces too)
    d["active_allocations"] = [
        {"allocation_id": v[1], "allocation_base": base, "allocation_bytes": v[0]}
        for base, v in sorted(_allocs.items(), key=lambda kv: kv[1][1])]
    d["max_active_allocations"] = _max_active[0]
    d["latest_failure"] = _last_failure
    return d
