"""One rank of test_hp_shmem_module.py: HyperParallel's ``hyper_parallel.core.multicore.shmem``
over megamoe's runtime, on 2 or more ranks (`megamoe launch -n N`). Prints "rank R: ok"."""
import inspect
import os

import torch

from hyper_parallel.core.multicore import shmem

R = int(os.environ["RANK"])
W = int(os.environ["WORLD_SIZE"])

# upstream's signatures (mindspore-ai/hyper-parallel shmem/_api.py, _lifecycle.py, _debug.py)
SIGS = {"acquire": "(root_group=None, *, heap_size_bytes=None)", "release": "()",
        "empty": "(*size, dtype=None, alignment=None)", "free": "(tensor)",
        "barrier": "(*, blocking=True)", "host_barrier": "()",
        "put": "(remote_dst, local_src, target_pe)", "get": "(local_dst, remote_src, source_pe)",
        "signal": "(remote_signal, value, target_pe, *, operation='set')",
        "wait_signal": "(signal_tensor, value, *, comparison='eq')", "debug_state": "()"}


def expect(exc, fn, *a, **k):
    try:
        fn(*a, **k)
    except exc as e:
        return str(e)
    raise AssertionError(f"{fn.__name__} did not raise {exc.__name__}")


def main():
    for name, sig in SIGS.items():
        assert str(inspect.signature(getattr(shmem, name))) == sig, (name,
                                                                     inspect.signature(getattr(shmem, name)))
    assert shmem.debug_state()["state"] == "Uninitialized"
    assert "acquire" in expect(RuntimeError, shmem.empty, 4)
    assert "no active reference" in expect(RuntimeError, shmem.release)
    shmem.acquire()
    shmem.acquire()  # a second reference shares the runtime
    st = shmem.debug_state()
    assert st["state"] == "Ready" and st["reference_count"] == 2 and st["root"]["size"] == W
    # allocation: varargs and a sequence, default dtype, alignment, zeroed
    a = shmem.empty(W, 64, dtype=torch.bfloat16)
    b = shmem.empty([W * 16], dtype=torch.int32, alignment=4096)
    c = shmem.empty(3)
    assert a.shape == (W, 64) and b.shape == (W * 16,) and c.dtype == torch.get_default_dtype()
    assert b.data_ptr() % 4096 == 0 and bool((a == 0).all()) and bool((b == 0).all())
    assert len(shmem.debug_state()["active_allocations"]) == 3
    shmem.barrier()  # everyone checked the zeros before anyone writes
    # put into every peer's slot R, then an add-signal on the peer's line R
    for p in range(W):
        shmem.put(a[R], torch.full((64,), float(R + 1)).bfloat16(), p)
        shmem.signal(b[16 * R:16 * R + 1], 1, p, operation="add")
    for p in range(W):  # the signal from p arrived: so did p's data
        shmem.wait_signal(b[16 * p:16 * p + 1], 1, comparison="ge")
        assert bool((a[p] == float(p + 1)).all()), (p, a[p])
    # get from the next rank (after a barrier: its put into its own slot may come after its
    # signal to this rank); set-signals; every comparison
    shmem.barrier()
    nxt = (R + 1) % W
    got = torch.empty(64, dtype=torch.bfloat16)
    shmem.get(got, a[nxt], nxt)
    assert bool((got == float(nxt + 1)).all())
    shmem.barrier()
    shmem.signal(b[16 * R:16 * R + 1], -5, nxt, operation="set")
    prv = (R - 1) % W
    line = b[16 * prv:16 * prv + 1]
    shmem.wait_signal(line, -5)
    for cmp, v in (("ne", 0), ("gt", -6), ("ge", -5), ("lt", 0), ("le", -5)):
        shmem.wait_signal(line, v, comparison=cmp)
    shmem.barrier()
    # all_gather into a symmetric output, positional and keyword input
    out = shmem.empty(W, 3, dtype=torch.float32)
    shmem.all_gather(out, torch.full((3,), float(R)))
    assert torch.equal(out, torch.arange(W, dtype=torch.float32).repeat_interleave(3).reshape(W, 3))
    shmem.all_gather(out, input=torch.full((3,), float(10 + R)))
    assert float(out[W - 1, 0]) == 10 + W - 1
    shmem.all_gather(out, torch.empty(0))  # zero bytes: a no-op
    # refusals
    assert "bytes" in expect(ValueError, shmem.put, a[0], torch.zeros(3), 0)
    assert "symmetric" in expect(ValueError, shmem.put, torch.zeros(64).bfloat16(), a[0], 0)
    assert "int32" in expect(ValueError, shmem.signal, a[0, :2], 1, 0)
    assert "'set' or 'add'" in expect(ValueError, shmem.signal, b[0:1], 1, 0, operation="or")
    assert "eq, ne" in expect(ValueError, shmem.wait_signal, b[0:1], 1, comparison="is")
    assert "not a rank" in expect(ValueError, shmem.put, a[0], a[0].clone(), W)
    assert "view" in expect(ValueError, shmem.free, a[0])
    assert "live allocation" in expect(RuntimeError, lambda: (shmem.release(), shmem.release()))
    shmem.acquire()  # (the first release above dropped to one reference)
    shmem.barrier(blocking=False)
    shmem.host_barrier()
    for t in (a, b, c, out):
        shmem.free(t)
    assert "freed" in expect(ValueError, shmem.put, a[0], torch.zeros(64).bfloat16(), 0)
    assert shmem.debug_state()["active_allocations"] == []
    shmem.release()
    shmem.release()
    assert shmem.debug_state()["state"] == "Uninitialized"
    # a new lifecycle with an explicit heap
    shmem.acquire(heap_size_bytes=64 << 20)
    assert shmem.debug_state()["config"]["heap_size_bytes"] >= 64 << 20
    assert "smaller" in expect(RuntimeError, shmem.acquire, heap_size_bytes=1 << 40)
    shmem.release()
    print(f"rank {R}: ok", flush=True)


if __name__ == "__main__":
    main()
