"""One rank of the MegaMoeExperts parity tests with HyperParallel's current module (run by
test_experts_parity.py under torchrun, gloo): the constructor's two capacity spellings and
their errors, dispatch_mode push/pull through autograd (bit-identical to the fixed capacity,
growth events in info()), tokens_per_expert's shape rule, and the SHMEM lifecycle ending
with the last close. Prints one line per case; exits non-zero when a case failed.

    python -m torch.distributed.run --nproc_per_node N experts_parity_worker.py [case ...]
"""
import math
import os
import sys
import traceback

import torch
import torch.distributed as dist

import megamoe
from megamoe import MegaMoeError, MegaMoeExperts

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_experts_worker as tw  # noqa: E402  (the shared problem/reference helpers)

T, H, I, E, K = tw.T, tw.H, tw.I, tw.E, tw.K


def make(ep, **kw):
    layer = MegaMoeExperts(local_num_tokens=T, hidden_size=H, intermediate_size=I,
                           num_experts=E, top_k=K, ep_size=ep, ep_group=dist.group.WORLD, **kw)
    return layer.to(device="cpu", dtype=torch.bfloat16)


def chk(cond, what):
    if not cond:
        print(f"FAIL: {what}", flush=True)
    return bool(cond)


def expect(exc_type, fn, *needles):
    try:
        fn()
    except exc_type as exc:
        missing = [n for n in needles if n not in str(exc)]
        if missing:
            print(f"FAIL: {exc_type.__name__} without {missing}: {exc}", flush=True)
        return not missing
    print(f"FAIL: no {exc_type.__name__} ({needles})", flush=True)
    return False


def case_constructor(rank, ep):
    ok = True
    # the seed: None is lossless, an explicit factor is finite and >= 1 (0 is refused)
    for bad in (0, 0.0, 0.5, float("nan"), float("inf"), True, "2"):
        ok &= expect(ValueError, lambda: make(ep, expert_capacity_factor=bad),
                     "expert_capacity_factor must be None or a finite number >= 1")
    ok &= expect(ValueError, lambda: make(ep, expert_capacity_factor=0), "leave it None")
    # HyperParallel's spelling
    ok &= expect(ValueError, lambda: make(ep, dispatch_mode="sideways"), "dispatch_mode")
    ok &= expect(ValueError, lambda: make(ep, dispatch_mode="pull", initial_capacity_factor=1.5),
                 "only supported for dispatch_mode 'push'")
    ok &= expect(ValueError, lambda: make(ep, dispatch_mode="pull", capacity_growth_factor=2),
                 "only supported")
    for name in ("initial_capacity_factor", "capacity_growth_factor"):
        for bad in (0, 0.99, float("nan"), False):
            ok &= expect(ValueError, lambda: make(ep, dispatch_mode="push", **{name: bad}),
                         f"{name} must be None or a finite number >= 1")
    # the two spellings do not combine
    for other in (dict(dispatch_mode="push"), dict(dispatch_mode="pull"),
                  dict(initial_capacity_factor=1.5), dict(capacity_growth_factor=1.5)):
        ok &= expect(ValueError, lambda: make(ep, expert_capacity_factor=2.0, **other),
                     "use one spelling")
    # what each resolves to
    lossless = -(-ep * T * K // 128) * 128
    layer = make(ep)
    i = layer.info()
    ok &= (i["capacity_policy"], i["dispatch_mode"], i["capacity"]) == ("fixed", "push", lossless)
    layer.close()
    layer = make(ep, dispatch_mode="push")
    i = layer.info()
    ok &= (i["capacity_policy"], i["initial_capacity_factor"], i["capacity_growth_factor"]) == \
        ("grow", 1.25, 1.25)
    ok &= i["capacity"] == -(-math.ceil(1.25 * T * K) // 128) * 128
    ok &= i["max_capacity"] == lossless and i["growth_events"] == 0 and i["growth"] == []
    ok &= layer.dispatch_mode == "push" and layer.capacity_growth_factor == 1.25
    layer.close()
    layer = make(ep, capacity_growth_factor=2)  # a growth factor alone means push
    ok &= layer.info()["capacity_policy"] == "grow" and layer.initial_capacity_factor == 1.25
    layer.close()
    layer = make(ep, dispatch_mode="pull")
    i = layer.info()
    ok &= (i["capacity_policy"], i["dispatch_mode"], i["capacity"]) == ("none", "pull", 0)
    layer.close()
    ok &= expect(ValueError, lambda: MegaMoeExperts.capacity_rows(ep, T, K, 0), "leave it None")
    return ok


def case_tokens_per_expert(rank, ep):
    ok = True
    P = tw.problem(ep, "skew", 31)
    layer = make(ep)
    tw.set_weights(layer, P, rank, ep)
    sl = slice(rank * T, (rank + 1) * T)
    x, ids, w = P["hidden"][sl], P["ids"][sl], P["probs"][sl]
    counts = torch.bincount(ids.long().flatten(), minlength=E)
    for bad in (counts.reshape(2, E // 2), counts[:-1], counts.float(), counts.reshape(1, E),
                counts.tolist()):
        ok &= expect(ValueError, lambda: layer(x, ids, w, tokens_per_expert=bad),
                     "tokens_per_expert must be the [E=8]")
    with torch.no_grad():
        plain = layer(x, ids, w)
        for tpe in (counts, counts.int(), torch.stack([counts, counts], 1)[:, 0]):  # strided
            ok &= torch.equal(plain, layer(x, ids, w, tokens_per_expert=tpe))
        # a histogram the ids contradict is refused (the layer routes by it)
        wrong = counts.clone()
        wrong[0] += 1
        wrong[1] -= 1
        ok &= expect(MegaMoeError, lambda: layer(x, ids, w, tokens_per_expert=wrong),
                     "tokens_per_expert")
    layer.close()
    return ok


def run(layer, P, rank):
    sl = slice(rank * T, (rank + 1) * T)
    x = P["hidden"][sl].clone().requires_grad_()
    w = P["probs"][sl].clone().requires_grad_()
    out = layer(x, P["ids"][sl], w)
    out.backward(P["grad"][sl])
    return [out.detach(), x.grad, w.grad, layer.gate_up_weight.grad, layer.down_weight.grad]


def case_modes(rank, ep):
    """push (growing) and pull give the fixed capacity's bits through autograd, O1 and O0; the
    growth shows in info()."""
    ok = True
    for ri, route in enumerate(("skew", "single")):
        P = tw.problem(ep, route, 40 + ri)
        need = tw.recv_rows(P["ids"], ep).max().item()
        base = make(ep, schedule="O0")
        tw.set_weights(base, P, rank, ep)
        want = run(base, P, rank)
        base.close()
        # the fixed run itself against the reference
        layer = make(ep)
        tw.set_weights(layer, P, rank, ep)
        x, w, out = tw.run_layer(layer, P, rank)
        ok &= tw.check_against_reference(f"{route} fixed", layer, P, rank, ep, x, w, out)
        layer.close()
        for sched in ("O0", "O1"):
            for kw in (dict(dispatch_mode="push", initial_capacity_factor=1.0,
                            capacity_growth_factor=1.0),
                       dict(dispatch_mode="push"), dict(dispatch_mode="pull")):
                layer = make(ep, schedule=sched, **kw)
                tw.set_weights(layer, P, rank, ep)
                cap0 = layer.info()["capacity"]
                got = run(layer, P, rank)
                same = all(torch.equal(a, b) for a, b in zip(got, want))
                if not same:
                    print(f"FAIL {route} {sched} {kw}: differs from the fixed capacity",
                          flush=True)
                ok &= same
                i = layer.info()
                if kw["dispatch_mode"] == "push":
                    grew = need > cap0
                    ok &= i["growth_events"] == int(grew) and len(i["growth"]) == int(grew)
                    if grew:
                        g = i["growth"][0]
                        ok &= g["rows_before"] == cap0 and g["rows_after"] == i["capacity"]
                        ok &= g["rows_after"] >= need and g["demand"] == need
                        ok &= g["heap_bytes_after"] > g["heap_bytes_before"]
                        ok &= g["heap_used_after"] > g["heap_used_before"]
                        if kw.get("capacity_growth_factor") == 1.0:
                            ok &= g["rows_after"] == -(-need // 128) * 128
                layer.close()
    return ok


def case_lifecycle(rank, ep):
    """The SHMEM lifecycle ends with the last close: a new endpoint and heap size set after it
    are the next lifecycle's (seed 000 "私有 SHMEM 生命周期")."""
    ok = True
    P = tw.problem(ep, "balanced", 51)
    sl = slice(rank * T, (rank + 1) * T)
    args = (P["hidden"][sl], P["ids"][sl], P["probs"][sl])
    os.environ.pop("HYPER_PARALLEL_SHMEM_HEAP_SIZE", None)
    a, b = make(ep), make(ep)
    with torch.no_grad():
        a(*args)
    heap = a.info()["shmem_heap_size"]
    ok &= chk(heap == 1 << 30, f"first heap {heap}")  # sized by the layer: max(1 GiB, need)
    a.close()
    with torch.no_grad():
        b(*args)  # not the last close: the runtime is still there
    b.close()
    ok &= chk(megamoe.comm._world is None, "a communicator is left")
    endpoint = os.environ["HYPER_PARALLEL_SHMEM_BOOTSTRAP_ENDPOINT"]
    # the next lifecycle reads the endpoint again: a bad one fails on every rank ...
    os.environ["HYPER_PARALLEL_SHMEM_BOOTSTRAP_ENDPOINT"] = "udp://127.0.0.1:1"
    ok &= expect(MegaMoeError, lambda: make(ep), "must start with tcp://")
    # ... a new one works, and the heap size set now is in effect
    os.environ["HYPER_PARALLEL_SHMEM_BOOTSTRAP_ENDPOINT"] = os.environ["MM_TEST_ENDPOINT2"]
    os.environ["HYPER_PARALLEL_SHMEM_HEAP_SIZE"] = "192M"
    c = make(ep)
    tw.set_weights(c, P, rank, ep)
    with torch.no_grad():
        out = c(*args)
    heap = c.info()["shmem_heap_size"]
    ok &= chk(heap == 192 << 20, f"second heap {heap}")
    c.close()
    ok &= chk(megamoe.comm._world is None, "a communicator is left after c")
    # a communicator the user asked for keeps the runtime past the last close
    os.environ["HYPER_PARALLEL_SHMEM_BOOTSTRAP_ENDPOINT"] = endpoint
    os.environ["HYPER_PARALLEL_SHMEM_HEAP_SIZE"] = "128M"
    mine = megamoe.comm.world()
    d = make(ep)
    tw.set_weights(d, P, rank, ep)
    with torch.no_grad():
        ok &= chk(torch.equal(d(*args), out), "d differs")
    d.close()
    heap = d.info()["shmem_heap_size"]
    ok &= chk(mine.alive and heap == 128 << 20, f"user comm: alive {mine.alive} heap {heap}")
    megamoe.comm.shutdown()
    ok &= chk(not mine.alive and megamoe.comm._world is None, "shutdown")
    del os.environ["HYPER_PARALLEL_SHMEM_HEAP_SIZE"]
    return ok


def case_expert_weights(rank, ep):
    """forward(..., expert_weights=(gate_up, down)) on a layer without parameters: the bits of
    the same weights as parameters (output and every gradient, the weights' own included),
    re-packed when the tensors change in place or are other tensors, never kept alive by the
    layer, and bad pairs refused on every rank."""
    import gc
    import weakref
    ok = True
    P = tw.problem(ep, "skew", 41)
    owned = make(ep)
    tw.set_weights(owned, P, rank, ep)
    bare = make(ep, create_parameters=False)
    sl = slice(rank * T, (rank + 1) * T)
    x0, ids, w0, g = P["hidden"][sl], P["ids"][sl], P["probs"][sl], P["grad"][sl]

    def step(layer, weights=None):
        x, w = x0.clone().requires_grad_(), w0.clone().requires_grad_()
        kw = {} if weights is None else {"expert_weights": weights}
        out = layer(x, ids, w, **kw)
        out.backward(g)
        return [out.detach(), x.grad, w.grad]

    gu = owned.gate_up_weight.detach().clone().requires_grad_()
    dn = owned.down_weight.detach().clone().requires_grad_()
    want = step(owned) + [owned.gate_up_weight.grad, owned.down_weight.grad]
    got = step(bare, (gu, dn)) + [gu.grad, dn.grad]
    ok &= chk(all(torch.equal(a, b) for a, b in zip(want, got)), "expert_weights != parameters")
    # an optimizer-like in-place change re-packs (the version counter), for both layers alike
    with torch.no_grad():
        for p_, q_ in ((owned.gate_up_weight, gu), (owned.down_weight, dn)):
            p_.mul_(0.5)
            q_.mul_(0.5)
    ok &= chk(all(torch.equal(a, b) for a, b in zip(step(owned)[:3], step(bare, (gu, dn))[:3])),
              "in-place change not seen")
    # other tensors (same values at other addresses, then other values) are packed anew
    gu2, dn2 = gu.detach().clone(), dn.detach().clone()
    ok &= chk(all(torch.equal(a, b) for a, b in zip(step(owned)[:3], step(bare, (gu2, dn2))[:3])),
              "new tensors with the same values")
    with torch.no_grad():
        owned.gate_up_weight.neg_()
    ok &= chk(all(torch.equal(a, b) for a, b in zip(
        step(owned)[:3], step(bare, (owned.gate_up_weight.detach().clone(), dn2))[:3])),
        "new tensors with other values")
    # the layer keeps no reference to weights it was given
    ref = weakref.ref(gu2)
    del gu2
    gc.collect()
    ok &= chk(ref() is None, "expert_weights kept alive by the layer")
    # bad pairs: this rank's error on every rank, and the layer still works afterwards
    bad = (gu[:, :, :-1], dn) if rank == 0 else (gu, dn)
    ok &= expect(ValueError, lambda: step(bare, bad), "gate_up_weight has shape")
    # (a TypeError on the rank that passed it, InvalidArgumentError with its message on all)
    ok &= expect(TypeError if rank == ep - 1 else MegaMoeError,
                 lambda: step(bare, (gu,) if rank == ep - 1 else (gu, dn)),
                 "expert_weights must be a (gate_up_weight, down_weight) pair")
    ok &= expect(ValueError, lambda: step(bare), "pass expert_weights=")
    ok &= chk(all(torch.equal(a, b) for a, b in zip(step(bare, (gu, dn))[:3],
                                                    step(bare, (gu, dn))[:3])), "usable after")
    owned.close()
    bare.close()
    return ok


CASES = {"constructor": case_constructor, "tokens_per_expert": case_tokens_per_expert,
         "modes": case_modes, "lifecycle": case_lifecycle, "expert_weights": case_expert_weights}


def main():
    dist.init_process_group("gloo")
    rank, ep = dist.get_rank(), dist.get_world_size()
    failed = []
    for name in sys.argv[1:] or list(CASES):
        try:
            ok = CASES[name](rank, ep)
        except Exception:  # report and keep the ranks in step for the verdict below
            traceback.print_exc()
            ok = False
        flag = torch.tensor([0.0 if ok else 1.0])
        dist.all_reduce(flag)
        print(f"rank {rank} ep {ep} case {name}: {'ok' if flag.item() == 0 else 'FAILED'}",
              flush=True)
        if flag.item() != 0:
            failed.append(name)
    megamoe.comm.shutdown()
    dist.destroy_process_group()
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
