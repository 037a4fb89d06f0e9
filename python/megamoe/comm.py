"""megamoe communicators from Python, bound to torch.distributed process groups.

``world()`` is the communicator of every rank of the job. It is created on first use: rank and
world size come from torch.distributed when it is initialised (so megamoe ranks are torch's
global ranks), else from RANK / WORLD_SIZE; the bootstrap endpoint comes from
HYPER_PARALLEL_SHMEM_BOOTSTRAP_ENDPOINT (default tcp://127.0.0.1:8662 — set a free port per job).

``for_group(pg)`` binds a communicator to a torch.distributed group; ``group_name(pg)`` returns a
name usable as ``group_ep`` / ``group_tp`` in :mod:`megamoe.ops`. Creating a group communicator
is collective over the group's MEMBERS only (``megamoe_comm_create_group``): ranks outside the
group never call into it, so two data-parallel replicas with an EP group each can create and use
their groups independently. The members of one group must create it at the same point of their
own call sequences.

Under an initialised torch.distributed default group (torchrun), ``world()`` draws a fresh job
secret on rank 0 and broadcasts it over that group, so the bootstrap is authenticated without
user work (a user-set MEGAMOE_JOB_TOKEN / MEGAMOE_JOB_TOKEN_FILE wins).

Communicators are destroyed by ``shutdown()`` (also registered with atexit); the last destroy
stops the symmetric-memory runtime, collectively on every rank.

``MegaMoeExperts`` layers do not keep a communicator of their own for the process's life: each
layer holds a counted reference (``_acquire`` / ``_release``) on the communicators it uses, and
a communicator that only layers asked for is destroyed when the last layer using it is closed.
So the SHMEM lifecycle ends with the last close (seed 000), and the next layer starts a new one
that reads HYPER_PARALLEL_SHMEM_BOOTSTRAP_ENDPOINT / HYPER_PARALLEL_SHMEM_HEAP_SIZE again. A
communicator your own code asked for (``world()``, ``for_group()``, ``group_name()``) stays
until ``shutdown()``. Layers on an EP subgroup end their group's communicator with the group's
last close (collective over the group's members only), but not the world's: ending the
lifecycle is a collective of every rank, which data-parallel replicas running on their own
schedules never reach together, so after a subgroup layer the lifecycle lasts until
``shutdown()`` (collective) or process exit.
"""
import atexit
import ctypes
import os
import secrets
import threading

from . import _adapter, _lib
from .errors import MegaMoeError, check

_lock = threading.RLock()
_world = None
_by_name = {}
_by_group = {}
_order = []  # creation order, destroyed in reverse
_survivor_comms = 0


@_lib.mirror("megamoe_comm_params_t")
class _Params(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_size_t), ("rank", ctypes.c_int), ("world_size", ctypes.c_int),
                ("endpoint", ctypes.c_char_p), ("heap_size", ctypes.c_uint64),
                ("timeout_sec", ctypes.c_int), ("job_token", ctypes.c_char_p)]


_L = _lib.lib
_L.megamoe_comm_create.restype = ctypes.c_int
_L.megamoe_comm_create.argtypes = [ctypes.POINTER(_Params), ctypes.POINTER(ctypes.c_void_p)]
_L.megamoe_comm_create_group.restype = ctypes.c_int
_L.megamoe_comm_create_group.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_int),
                                         ctypes.c_int, ctypes.POINTER(ctypes.c_void_p)]
_L.megamoe_comm_split.restype = ctypes.c_int
_L.megamoe_comm_split.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_int,
                                  ctypes.POINTER(ctypes.c_void_p)]
_L.megamoe_comm_rank.restype = ctypes.c_int
_L.megamoe_comm_rank.argtypes = [ctypes.c_void_p]
_L.megamoe_comm_size.restype = ctypes.c_int
_L.megamoe_comm_size.argtypes = [ctypes.c_void_p]
_L.megamoe_comm_barrier.restype = ctypes.c_int
_L.megamoe_comm_barrier.argtypes = [ctypes.c_void_p]
_L.megamoe_comm_destroy.restype = ctypes.c_int
_L.megamoe_comm_destroy.argtypes = [ctypes.c_void_p]
_L.megamoe_comm_rank_alive.restype = ctypes.c_int
_L.megamoe_comm_rank_alive.argtypes = [ctypes.c_void_p, ctypes.c_int]
_L.megamoe_comm_survivors.restype = ctypes.c_int
_L.megamoe_comm_survivors.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_void_p)]


class Comm:
    """A megamoe communicator (``megamoe_comm_t*``)."""

    def __init__(self, handle, name, world_ranks):
        self._handle = handle
        self.name = name
        self.world_ranks = tuple(world_ranks)
        self._leases = 0      # MegaMoeExperts layers using it (_acquire / _release)
        self._pinned = False  # the world once a layer used an EP subgroup: kept until shutdown
        self._user = False    # asked for by the user's own code: kept until shutdown()
        _adapter.register_group(name, handle.value)  # torch.ops.megamoe resolves it by name

    @property
    def handle(self):
        if self._handle is None:
            raise MegaMoeError(-2, f"communicator {self.name} was destroyed")
        return self._handle

    @property
    def rank(self):
        return _L.megamoe_comm_rank(self.handle)

    @property
    def size(self):
        return _L.megamoe_comm_size(self.handle)

    def barrier(self):
        check(_L.megamoe_comm_barrier(self.handle))

    # -- through a lost rank (docs/reliability.md "Surviving a lost rank")
    def rank_alive(self, i):
        """False once rank i of this communicator was lost (a killed process, a host gone or
        cut off); local. A communicator holding a lost rank is broken: its collectives raise
        PEER_LOST; go on with :meth:`survivors`."""
        return bool(_L.megamoe_comm_rank_alive(self.handle, int(i)))

    def survivors(self):
        """A communicator of this one's ranks still alive, in its order; collective over them
        (waits until the survivors agreed on who is gone; raises PEER_LOST on a rank that is
        out: declared lost, or on the smaller side of a cut). Kept until :func:`shutdown`."""
        with _lock:
            handle = ctypes.c_void_p()
            check(_L.megamoe_comm_survivors(self.handle, ctypes.byref(handle)))
            ranks = [r for i, r in enumerate(self.world_ranks) if self.rank_alive(i)]
            global _survivor_comms
            _survivor_comms += 1  # the same on every survivor: they make these in one order
            name = (f"megamoe:survivors{_survivor_comms}:" +
                    ",".join(str(r) for r in ranks))
            comm = Comm(handle, name, ranks)
            comm._user = True
            _by_name[name] = comm
            _order.append(comm)
            return comm

    def destroy(self):
        """Collective; the last destroy in the process stops the runtime."""
        with _lock:
            if self._handle is None:
                return
            check(_L.megamoe_comm_destroy(self._handle))
            _adapter.register_group(self.name, None)
            self._handle = None
            _by_name.pop(self.name, None)
            for key, (_, comm) in list(_by_group.items()):
                if comm is self:
                    del _by_group[key]
            if self in _order:
                _order.remove(self)
            global _world
            if _world is self:
                _world = None

    @property
    def alive(self):
        return self._handle is not None

    def __repr__(self):
        state = f"rank {self.rank}/{self.size}" if self.alive else "destroyed"
        return f"<megamoe.comm.Comm {self.name} {state}>"


def _torch_dist():
    try:
        import torch.distributed as dist
    except ImportError:  # pragma: no cover - torch is a dependency of the binding
        return None
    if dist.is_available() and dist.is_initialized():
        return dist
    return None


def _torch_secret(dist):
    """A fresh job secret from rank 0 over the initialised torch.distributed default group, so
    the bootstrap is authenticated under torchrun without user work (None when the user set
    MEGAMOE_JOB_TOKEN / MEGAMOE_JOB_TOKEN_FILE: theirs wins on every rank, or with one rank)."""
    if dist.get_world_size() < 2 or os.environ.get("MEGAMOE_JOB_TOKEN") or \
            os.environ.get("MEGAMOE_JOB_TOKEN_FILE"):
        return None
    box = [secrets.token_hex(32) if dist.get_rank() == 0 else None]
    dist.broadcast_object_list(box, src=0)
    return box[0].encode()


def world(endpoint=None, heap_size=0, timeout_sec=0):
    """The world communicator, created on first call (collective over all ranks)."""
    with _lock:
        comm = _world_comm(endpoint, heap_size, timeout_sec)
        comm._user = True
        return comm


def _world_comm(endpoint=None, heap_size=0, timeout_sec=0):
    global _world
    with _lock:
        if _world is not None and _world.alive:
            return _world
        params = _lib.default(_Params)
        dist = _torch_dist()
        secret = None
        if dist is not None:
            params.rank = dist.get_rank()
            params.world_size = dist.get_world_size()
            secret = _torch_secret(dist)
            if secret is not None:
                params.job_token = secret
        if endpoint is not None:
            params.endpoint = endpoint.encode()
        params.heap_size = int(heap_size)
        params.timeout_sec = int(timeout_sec)
        handle = ctypes.c_void_p()
        check(_L.megamoe_comm_create(ctypes.byref(params), ctypes.byref(handle)))
        n = _L.megamoe_comm_size(handle)
        _world = Comm(handle, "megamoe:world", range(n))
        _by_name[_world.name] = _world
        _order.append(_world)
        return _world


def _group_ranks(pg):
    """Global ranks of a torch process group, in group-rank order."""
    import torch.distributed as dist
    if hasattr(dist, "get_process_group_ranks"):
        return list(dist.get_process_group_ranks(pg))
    from torch.distributed import distributed_c10d as c10d
    mapping = c10d._pg_group_ranks[pg]  # {global rank: group rank}
    return [g for g, _ in sorted(mapping.items(), key=lambda kv: kv[1])]


def for_group(process_group=None):
    """Communicator of a torch.distributed group (None or WORLD gives ``world()``)."""
    with _lock:
        comm = _group_comm(process_group)
        comm._user = True
        _world._user = True  # the group is a split of it
        return comm


def _is_world(process_group):
    dist = _torch_dist()
    return process_group is None or dist is None or process_group is dist.group.WORLD


def _group_comm(process_group, heap_size=0):
    dist = _torch_dist()
    w = _world_comm(heap_size=heap_size)
    if _is_world(process_group):
        return w
    with _lock:
        key = id(process_group)
        entry = _by_group.get(key)
        # the entry keeps its group alive, so its id cannot be recycled for another group
        if entry is not None and entry[0] is process_group and entry[1].alive:
            return entry[1]
        ranks = _group_ranks(process_group)
        me = dist.get_rank()
        if me not in ranks:
            raise MegaMoeError(-1, f"rank {me} is not a member of the process group {ranks}; "
                                   "call for_group/group_name only with groups containing "
                                   "the calling rank")
        # collective over the group's members only: ranks outside it never take part
        arr = (ctypes.c_int * len(ranks))(*ranks)
        handle = ctypes.c_void_p()
        check(_L.megamoe_comm_create_group(w.handle, arr, len(ranks), ctypes.byref(handle)))
        name = "megamoe:group:" + ",".join(str(r) for r in ranks)
        comm = Comm(handle, name, ranks)
        _by_group[key] = (process_group, comm)
        _by_name[name] = comm
        _order.append(comm)
        return comm


def group_name(process_group=None):
    """Name of the communicator bound to a torch.distributed group (``group_ep``/``group_tp``)."""
    return for_group(process_group).name


def by_name(name):
    """The live communicator with this name (MegaMoeError INVALID_ARGUMENT if none)."""
    with _lock:
        comm = _by_name.get(name)
    if comm is None or not comm.alive:
        raise MegaMoeError(-1, f"no megamoe communicator named {name!r}; get one from "
                               "megamoe.comm.group_name(process_group)")
    return comm


def _acquire(process_group=None, heap_size=0):
    """For MegaMoeExperts: the communicators a layer over process_group needs (the world, then
    the group's when it is not the world), each counted once; pass the list to ``_release``.
    heap_size applies when this call starts the runtime."""
    with _lock:
        world_comm = _world_comm(heap_size=heap_size)
        if _is_world(process_group):
            chain = [world_comm]
        else:
            # An EP subgroup: the group's communicator ends with the group's last layer (a
            # collective of its members only), but the world's end is a collective of every
            # rank, which replicas on their own schedules never reach together: the world (and
            # with it the SHMEM lifecycle) stays until shutdown() or exit.
            world_comm._pinned = True
            chain = [_group_comm(process_group)]
        for comm in chain:
            comm._leases += 1
        return chain


def _release(chain):
    """Pairs with ``_acquire`` (collective when it destroys: every rank releases its layers in
    the same order). A communicator no layer uses any more and the user never asked for is
    destroyed, newest first; the world's last destroy ends the SHMEM lifecycle."""
    with _lock:
        for comm in chain:
            comm._leases -= 1
        for comm in reversed(chain):
            if comm._leases == 0 and not comm._user and not comm._pinned and comm.alive:
                comm.destroy()


def shutdown():
    """Destroy every communicator this process created, newest first (collective)."""
    with _lock:
        for comm in reversed(list(_order)):
            comm.destroy()


@atexit.register
def _shutdown_at_exit():  # pragma: no cover - exercised by process exit
    try:
        shutdown()
    except MegaMoeError:
        pass
