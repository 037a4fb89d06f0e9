"""One rank of the call-order tests from PyTorch (test_call_order_torch.py runs it under
`megamoe launch -n 2`; a gloo group over a file store gives the reference checks a WORLD).

    call_order_worker.py STORE_FILE [case ...]

Each case makes the ranks call differently (collective calls out of order, or a bad tensor on
one rank), asserts that EVERY rank raises the same error type with a message naming the calls
or the bad rank, that no tensor came back, and that the next call made in the same order gives
the reference's results. Prints "rank R case C: ok|FAILED"."""
import os
import sys
import traceback

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import megamoe  # noqa: E402
from megamoe import MegaMoeError, MegaMoeExperts  # noqa: E402
from megamoe.errors import CallMismatchError, InvalidArgumentError  # noqa: E402
from torch_experts_worker import (E, H, I, K, T, check_against_reference, make_layer,  # noqa: E402
                                  problem, run_layer, set_weights)

RANK = int(os.environ["RANK"])
EP = int(os.environ["WORLD_SIZE"])


def expect(fn, exc_type, *needles):
    """fn() must raise exc_type with every needle in its message (and return nothing)."""
    try:
        got = fn()
    except exc_type as exc:
        msg = str(exc)
        missing = [n for n in needles if n not in msg]
        if missing:
            print(f"rank {RANK}: message lacks {missing}: {msg}", flush=True)
            return False
        return True
    except Exception as exc:  # noqa: BLE001
        print(f"rank {RANK}: expected {exc_type.__name__}, got {type(exc).__name__}: {exc}",
              flush=True)
        return False
    print(f"rank {RANK}: expected {exc_type.__name__}, got a result {type(got)}", flush=True)
    return False


def fresh(seed):
    P = problem(EP, "skew", seed)
    layer = make_layer(EP)
    set_weights(layer, P, RANK, EP)
    return layer, P


def correct_step(name, layer, P):
    x, w, out = run_layer(layer, P, RANK)
    return check_against_reference(name, layer, P, RANK, EP, x, w, out)


def fwd(layer, P):
    return lambda: run_layer(layer, P, RANK)[2]


def case_swapped_shared_layers():
    a, Pa = fresh(11)
    b, Pb = fresh(12)
    MegaMoeExperts.share_execution_resources([a, b])
    na, nb = a.layer_number, b.layer_number
    ok = True
    order = [(a, Pa), (b, Pb)] if RANK == 0 else [(b, Pb), (a, Pa)]
    for layer, P in order:
        ok &= expect(fwd(layer, P), CallMismatchError, f"forward of layer #{na}",
                     f"forward of layer #{nb}", "rank 0 called", "rank 1 called")
    ok &= correct_step("a after the swapped calls", a, Pa)
    ok &= correct_step("b after the swapped calls", b, Pb)
    a.close()
    b.close()
    return ok


def case_close_against_forward():
    layer, P = fresh(13)
    n = layer.layer_number
    if RANK == 0:
        ok = expect(layer.close, CallMismatchError, f"rank 0 called close of layer #{n}",
                    f"rank 1 called forward of layer #{n}")
        ok &= not layer.info()["closed"]
    else:
        ok = expect(fwd(layer, P), CallMismatchError, f"rank 0 called close of layer #{n}",
                    f"rank 1 called forward of layer #{n}")
    ok &= correct_step("after close/forward", layer, P)
    layer.close()
    return ok


def case_forward_against_backward():
    layer, P = fresh(14)
    sl = slice(RANK * T, (RANK + 1) * T)
    x, w, out = run_layer(layer, P, RANK)
    if RANK == 0:  # a second forward while the peer runs the first one's backward
        ok = expect(fwd(layer, P), CallMismatchError, "rank 0 called forward",
                    "rank 1 called backward")
    else:
        ok = expect(lambda: out.backward(P["grad"][sl]), CallMismatchError,
                    "rank 0 called forward", "rank 1 called backward")
        ok &= x.grad is None
    # an extra inference forward on rank 0 while rank 1 closes: the layer stays open there
    if RANK == 0:
        with torch.no_grad():
            ok &= expect(fwd(layer, P), CallMismatchError, "rank 0 called forward",
                         "rank 1 called close")
    else:
        ok &= expect(layer.close, CallMismatchError, "rank 0 called forward",
                     "rank 1 called close")
    del x, w, out
    ok &= correct_step("after the extra forward", layer, P)
    layer.close()
    return ok


def case_bad_tensor_on_one_rank():
    """Issue 13 item 7: dtype, shape, device, contiguity, not a tensor; every rank gets the bad
    rank's error (InvalidArgumentError, also a ValueError), within the exchange; the layer
    works on."""
    layer, P = fresh(15)
    sl = slice(RANK * T, (RANK + 1) * T)
    hidden, ids, probs = P["hidden"][sl], P["ids"][sl], P["probs"][sl]
    ok = True
    bad = {
        "dtype": (1, lambda: layer(hidden.float() if RANK == 1 else hidden, ids, probs),
                  "hidden_states is torch.float32"),
        "shape": (0, lambda: layer(hidden, ids[:, :1] if RANK == 0 else ids, probs),
                  "topk_ids must be int32/int64"),
        "type": (0, lambda: layer(hidden, ids, probs.tolist() if RANK == 0 else probs),
                 "topk_weights must be a torch.Tensor"),
        "device": (1, lambda: layer(torch.empty(hidden.shape, dtype=hidden.dtype, device="meta")
                                    if RANK == 1 else hidden, ids, probs),
                   "hidden_states is on meta"),
    }
    for name, (who, call, needle) in bad.items():
        ok &= expect(call, InvalidArgumentError, f"rank {who}: INVALID_ARGUMENT: {needle}")
        ok &= expect(call, ValueError, needle)  # the same error is also a ValueError
    # not a tensor: on the rank that passed it also the TypeError it is
    ok &= expect(bad["type"][1], TypeError if RANK == 0 else ValueError,
                 "topk_weights must be a torch.Tensor")
    # a weight that is not contiguous on rank 1 only
    keep = layer.gate_up_weight.data
    if RANK == 1:
        layer.gate_up_weight.data = keep.transpose(1, 2).contiguous().transpose(1, 2)
    ok &= expect(fwd(layer, P), InvalidArgumentError,
                 "rank 1: INVALID_ARGUMENT: gate_up_weight must be contiguous")
    layer.gate_up_weight.data = keep
    # sharing a list with something else in it on rank 0
    other = make_layer(EP)
    ok &= expect(lambda: MegaMoeExperts.share_execution_resources(
        [other, "layer"] if RANK == 0 else [other]), MegaMoeError,
        "rank 0: INVALID_ARGUMENT: share_execution_resources got str")
    other.close()
    ok &= correct_step("after the bad tensors", layer, P)
    layer.close()
    return ok


CASES = {"swapped_shared_layers": case_swapped_shared_layers,
         "close_against_forward": case_close_against_forward,
         "forward_against_backward": case_forward_against_backward,
         "bad_tensor_on_one_rank": case_bad_tensor_on_one_rank}


def main():
    dist.init_process_group("gloo", init_method="file://" + sys.argv[1], rank=RANK,
                            world_size=EP)
    names = sys.argv[2:] or list(CASES)
    failed = 0
    for name in names:
        try:
            ok = CASES[name]()
        except Exception:  # noqa: BLE001
            traceback.print_exc()
            ok = False
        print(f"rank {RANK} case {name}: {'ok' if ok else 'FAILED'}", flush=True)
        failed += not ok
    megamoe.comm.shutdown()  # fails if a layer or the runtime were left out of step
    dist.destroy_process_group()
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
