"""Worker for test_comm.py (run under `megamoe launch`): megamoe communicators bound to
torch.distributed gloo groups."""
import sys
import time

import torch.distributed as dist

import megamoe
from megamoe import comm


def ep_tp_grid():
    """4 ranks as 2 EP x 2 TP groups: names, sizes, ranks and barriers per group."""
    r = dist.get_rank()
    ep = [dist.new_group([0, 1]), dist.new_group([2, 3])]
    tp = [dist.new_group([0, 2]), dist.new_group([1, 3])]
    n_ep, n_tp = comm.group_name(ep[r // 2]), comm.group_name(tp[r % 2])
    c_ep, c_tp = comm.by_name(n_ep), comm.by_name(n_tp)
    assert n_ep == "megamoe:group:" + ("0,1" if r < 2 else "2,3"), n_ep
    assert n_tp == "megamoe:group:" + ("0,2" if r % 2 == 0 else "1,3"), n_tp
    assert (c_ep.rank, c_ep.size, c_tp.rank, c_tp.size) == (r % 2, 2, r // 2, 2)
    assert comm.for_group(ep[r // 2]) is c_ep  # cached
    assert comm.for_group(None) is comm.world()
    for _ in range(3):
        c_ep.barrier()
        c_tp.barrier()
    try:
        comm.by_name("megamoe:group:9,9")
    except megamoe.MegaMoeError as e:
        assert "no megamoe communicator named" in str(e)
    else:
        raise AssertionError("by_name of an unknown name did not raise")


def non_member():
    """Rank 1 asks for a group it is not in: it gets a clear error, rank 0 does not hang."""
    g0 = dist.new_group([0])
    t0 = time.monotonic()
    if dist.get_rank() == 0:
        c = comm.for_group(g0)
        assert (c.rank, c.size) == (0, 1)
    else:
        try:
            comm.for_group(g0)
        except megamoe.MegaMoeError as e:
            assert "not a member" in str(e), e
        else:
            raise AssertionError("a non-member got a communicator")
    assert time.monotonic() - t0 < 10, "the split waited for the non-member"
    comm.world().barrier()


def main(case):
    dist.init_process_group("gloo")
    comm.world()
    {"grid": ep_tp_grid, "non_member": non_member}[case]()
    comm.shutdown()
    assert not comm.world.__globals__["_order"]
    print(f"case {case}: ok")


if __name__ == "__main__":
    main(sys.argv[1])
