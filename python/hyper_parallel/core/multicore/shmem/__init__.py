"""``from hyper_parallel.core.multicore import shmem``: HyperParallel's process-wide one-sided
SHMEM API (acquire, release, empty, free, put, get, signal, wait_signal, barrier, host_barrier,
all_gather, debug_state) with upstream's signatures, over megamoe's runtime (megamoe.symm;
docs/shmem.md "Python shmem module")."""
from megamoe.symm import (acquire, all_gather, barrier, debug_state, empty, free, get,  # noqa: F401
                          host_barrier, put, release, signal, wait_signal)

__all__ = ["acquire", "all_gather", "barrier", "debug_state", "empty", "free", "get",
           "host_barrier", "put", "release", "signal", "wait_signal"]
