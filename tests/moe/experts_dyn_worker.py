"""One rank of the PyTorch tests of per-call token counts (``MegaMoeExperts(max_local_num_tokens=
T_cap)``, docs/moe.md "Dynamic tokens"), run by test_experts_dyn.py under torchrun (gloo). Every
rank builds the same global problem of T_cap tokens per rank; a call passes the first T_r rows
of each rank's slice (counts drawn the same on every rank), so the reference is the whole
problem with the output gradient of the absent rows zeroed. One line per case; exit 1 on failure.

    python -m torch.distributed.run --nproc_per_node N experts_dyn_worker.py [case ...]
"""
import math
import sys
import traceback

import torch
import torch.distributed as dist

import megamoe
from megamoe import MegaMoeExperts, MegaMoeError
from megamoe import reference
from megamoe.errors import InvalidArgumentError

TCAP, H, I, E, K = 200, 64, 32, 8, 2
RTOL, ATOL, REL_L2, REL_MAX = 2e-2, 2e-3, 1e-2, 2e-2


def close(name, got, want, want16):
    """bench/moe_verify.h's rule; the fp32 oracle's statistics decide from 1024 values on (a
    1-token call's K router-weight gradients are two numbers)."""
    got, want, want16 = got.float(), want.float(), want16.float()
    if got.numel() == 0:
        return want.numel() == 0
    err = (got - want).abs()
    rel_l2 = (err.norm() / want.norm().clamp_min(1e-30)).item()
    rel_max = (err.max() / want.abs().max().clamp_min(1e-30)).item()
    scale = max(1.0, want16.abs().max().item())
    inside = ((got - want16).abs() <= ATOL * scale + RTOL * want16.abs()).float().mean().item()
    oracle_ok = (rel_l2 <= REL_L2 and rel_max <= REL_MAX) or got.numel() < 1024
    ok = bool(torch.isfinite(got).all()) and inside == 1.0 and oracle_ok
    if not ok:
        print(f"FAIL {name}: relL2 {rel_l2:.4f} maxerr/maxref {rel_max:.4f} "
              f"elementwise {100 * inside:.3f}% (atol x {scale:.3g})", flush=True)
    return ok


def problem(ep, seed, route="balanced"):
    g = torch.Generator().manual_seed(seed)
    n = ep * TCAP
    hidden = (torch.rand(n, H, generator=g) * 2 - 1).bfloat16()
    grad = (torch.rand(n, H, generator=g) * 2 - 1).bfloat16()
    gate_up = ((torch.rand(E, H, 2 * I, generator=g) * 2 - 1) * math.sqrt(6 / (H + 2 * I))).bfloat16()
    down = ((torch.rand(E, I, H, generator=g) * 2 - 1) * math.sqrt(6 / (I + H))).bfloat16()
    if route == "balanced":
        tok = torch.arange(n)
        ids = torch.stack([(tok + k * (E // K)) % E for k in range(K)], 1).int()
    else:  # skewed: 3/4 of first choices to expert 0, distinct experts per token
        ids = torch.stack([torch.randperm(E, generator=g)[:K] for _ in range(n)]).int()
        hot = torch.rand(n, generator=g) < 0.75
        ids[hot & (ids[:, 1] != 0), 0] = 0
    probs = torch.softmax(torch.rand(n, K, generator=g) * 2 - 1, dim=1)
    return dict(hidden=hidden, grad=grad, gate_up=gate_up, down=down, ids=ids, probs=probs)


EDGE = (0, 1, 127, 128, 129, TCAP)


def counts(call, ep):
    """The same per-rank counts on every rank: the edge counts rotated, and random ones."""
    g = torch.Generator().manual_seed(1000 + call)
    rnd = torch.randint(0, TCAP + 1, (ep,), generator=g).tolist()
    return [EDGE[(r + call) % len(EDGE)] if call % 2 == 0 else rnd[r] for r in range(ep)]


def make(ep, **kw):
    kw.setdefault("schedule", "O1")
    layer = MegaMoeExperts(hidden_size=H, intermediate_size=I, num_experts=E, top_k=K,
                           ep_size=ep, ep_group=dist.group.WORLD, max_local_num_tokens=TCAP, **kw)
    return layer.to(device="cpu", dtype=torch.bfloat16)


def local_weights(P, rank, ep):
    L = E // ep
    return P["gate_up"][rank * L:(rank + 1) * L], P["down"][rank * L:(rank + 1) * L]


def set_weights(layer, P, rank, ep):
    gu, dn = local_weights(P, rank, ep)
    with torch.no_grad():
        layer.gate_up_weight.copy_(gu)
        layer.down_weight.copy_(dn)


def rows(P, rank, n):
    sl = slice(rank * TCAP, rank * TCAP + n)
    return (P["hidden"][sl].clone().requires_grad_(), P["ids"][sl].clone(),
            P["probs"][sl].clone().requires_grad_(), P["grad"][sl])


def ref_of(P, n, ep):
    """Both references of a call where rank r passed its first n[r] rows."""
    grad = P["grad"].clone()
    for r in range(ep):
        grad[r * TCAP + n[r]:(r + 1) * TCAP] = 0
    args = (P["hidden"], P["ids"], P["probs"], P["gate_up"], P["down"])
    out = [reference.forward(*args, ep=ep, bf16_intermediates=b) for b in (False, True)]
    g = [reference.backward(grad, *args, ep=ep, bf16_intermediates=b) for b in (False, True)]
    return out, g


def check_call(name, P, rank, ep, n, x, w, out, gu_grad, dn_grad):
    L = E // ep
    (ref, ref16), (g, g16) = ref_of(P, n, ep)
    sl = slice(rank * TCAP, rank * TCAP + n[rank])
    es = slice(rank * L, (rank + 1) * L)
    ok = tuple(out.shape) == (n[rank], H)
    ok &= x.grad is not None and tuple(x.grad.shape) == (n[rank], H)
    ok &= w.grad is not None and tuple(w.grad.shape) == (n[rank], K)
    ok &= gu_grad is not None and dn_grad is not None
    if not ok:
        print(f"FAIL {name}: shapes out {tuple(out.shape)} grads "
              f"{None if x.grad is None else tuple(x.grad.shape)} "
              f"{None if w.grad is None else tuple(w.grad.shape)}", flush=True)
        return False
    ok &= close(f"{name} output", out.detach(), ref[sl], ref16[sl])
    ok &= close(f"{name} grad hidden", x.grad, g.hidden[sl], g16.hidden[sl])
    ok &= close(f"{name} grad topk_weights", w.grad, g.topk_weights[sl], g16.topk_weights[sl])
    ok &= close(f"{name} grad gate_up", gu_grad, g.gate_up[es], g16.gate_up[es])
    ok &= close(f"{name} grad down", dn_grad, g.down[es], g16.down[es])
    present = torch.cat([P["ids"][r * TCAP:r * TCAP + n[r]].long().flatten() for r in range(ep)])
    used = torch.bincount(present, minlength=E)[es]
    for j in range(L):
        zero = bool((gu_grad[j] == 0).all() and (dn_grad[j] == 0).all())
        if zero != (used[j].item() == 0):
            print(f"FAIL {name}: expert {rank * L + j} got {used[j].item()} slots, zero grads "
                  f"{zero}", flush=True)
            ok = False
    return ok


def gather_weights(P, layer, rank, ep):
    """P with every rank's current weights (after an optimizer step)."""
    full = []
    for t in (layer.gate_up_weight, layer.down_weight):
        parts = [torch.empty_like(t).float() for _ in range(ep)]
        dist.all_gather(parts, t.detach().float().contiguous())
        full.append(torch.cat(parts).bfloat16())
    return dict(P, gate_up=full[0], down=full[1])


def case_counts(rank, ep):
    """Per-rank, per-call counts (0, 1, 127..129, T_cap, random) through autograd, O0 and O1
    and push, against the reference; an SGD step between calls (the layers re-pack)."""
    ok = True
    for sched, mode in (("O1", None), ("O0", None), ("O1", "push")):
        P = problem(ep, 5)
        layer = make(ep, schedule=sched, dispatch_mode=mode)
        set_weights(layer, P, rank, ep)
        opt = torch.optim.SGD(layer.parameters(), lr=0.1)
        for call in range(4):
            n = counts(call, ep)
            x, ids, w, gout = rows(P, rank, n[rank])
            out = layer(x, ids, w)
            out.backward(gout)
            name = f"{sched} {mode or 'fixed capacity'} call {call} counts {n}"
            ok &= check_call(name, P, rank, ep, n, x, w, out, layer.gate_up_weight.grad,
                             layer.down_weight.grad)
            info = layer.info()
            ok &= info["last_tokens"] == n[rank] and info["max_local_num_tokens"] == TCAP
            opt.step()
            opt.zero_grad(set_to_none=False)
            P = gather_weights(P, layer, rank, ep)
        layer.close()
    return ok


def case_identity(rank, ep):
    """Every rank passes T = 128: the same bits as local_num_tokens=128, and O0 = O1."""
    P = problem(ep, 8, "skewed")
    results = []
    for sched in ("O0", "O1"):
        for dynamic in (False, True):
            kw = dict(max_local_num_tokens=TCAP) if dynamic else dict(local_num_tokens=128)
            layer = MegaMoeExperts(hidden_size=H, intermediate_size=I, num_experts=E, top_k=K,
                                   ep_size=ep, ep_group=dist.group.WORLD, schedule=sched,
                                   **kw).to(dtype=torch.bfloat16)
            set_weights(layer, P, rank, ep)
            x, ids, w, gout = rows(P, rank, 128)
            out = layer(x, ids, w)
            out.backward(gout)
            results.append((out.detach(), x.grad, w.grad, layer.gate_up_weight.grad,
                            layer.down_weight.grad))
            layer.close()
    ok = True
    for i, r in enumerate(results[1:], 1):
        same = all(torch.equal(a, b) for a, b in zip(r, results[0]))
        if not same:
            print(f"FAIL identity: result {i} differs from the fixed O0 layer", flush=True)
        ok &= same
    return ok


def case_empty(rank, ep):
    """A rank with no token still calls forward and backward and serves its experts; when
    every rank is empty the weight gradients are exact zeros (tensors, never None);
    torch.no_grad() and expert_weights= work with any count."""
    P = problem(ep, 6)
    layer = make(ep)
    set_weights(layer, P, rank, ep)
    ok = True
    for n in ([0] * ep, [0] + [TCAP] * (ep - 1), [TCAP] * (ep - 1) + [0]):
        x, ids, w, gout = rows(P, rank, n[rank])
        out = layer(x.view(1, -1, H), ids, w)  # [1, T_r, H]: the output has the input's shape
        ok &= tuple(out.shape) == (1, n[rank], H)
        out.backward(gout.view(1, -1, H))
        ok &= check_call(f"empty {n}", P, rank, ep, n, x, w, out.view(-1, H),
                         layer.gate_up_weight.grad, layer.down_weight.grad)
        if sum(n) == 0:
            ok &= bool((layer.gate_up_weight.grad == 0).all() and
                       (layer.down_weight.grad == 0).all())
        layer.zero_grad(set_to_none=True)
    with torch.no_grad():
        n = counts(1, ep)
        x, ids, w, _ = rows(P, rank, n[rank])
        out = layer(x, ids, w)
        (ref, ref16), _ = ref_of(P, n, ep)
        sl = slice(rank * TCAP, rank * TCAP + n[rank])
        ok &= close("no_grad output", out, ref[sl], ref16[sl])
    layer.close()
    # per-call weights owned outside (create_parameters=False)
    ext = make(ep, create_parameters=False)
    gu, dn = (t.clone().requires_grad_() for t in local_weights(P, rank, ep))
    n = counts(2, ep)
    x, ids, w, gout = rows(P, rank, n[rank])
    out = ext(x, ids, w, expert_weights=(gu, dn))
    out.backward(gout)
    ok &= check_call(f"expert_weights {n}", P, rank, ep, n, x, w, out, gu.grad, dn.grad)
    ext.close()
    return ok


def case_shared_outstanding(rank, ep):
    """Two dynamic layers sharing execution resources, different counts per layer and call,
    two outstanding forwards of one layer whose backwards run in reverse order."""
    P = problem(ep, 9)
    a, b = make(ep), make(ep)
    MegaMoeExperts.share_execution_resources([a, b])
    for layer in (a, b):
        set_weights(layer, P, rank, ep)
    ok = True
    n1, n2, n3 = counts(1, ep), counts(2, ep), counts(3, ep)
    x1, i1, w1, g1 = rows(P, rank, n1[rank])
    x2, i2, w2, g2 = rows(P, rank, n2[rank])
    x3, i3, w3, g3 = rows(P, rank, n3[rank])
    o1 = a(x1, i1, w1)
    o3 = b(x3, i3, w3)
    o2 = a(x2, i2, w2)
    o2.backward(g2)  # the later forward first
    ok &= check_call(f"outstanding second {n2}", P, rank, ep, n2, x2, w2, o2,
                     a.gate_up_weight.grad.clone(), a.down_weight.grad.clone())
    a.zero_grad(set_to_none=True)
    o3.backward(g3)
    ok &= check_call(f"shared layer {n3}", P, rank, ep, n3, x3, w3, o3, b.gate_up_weight.grad,
                     b.down_weight.grad)
    o1.backward(g1)
    ok &= check_call(f"outstanding first {n1}", P, rank, ep, n1, x1, w1, o1,
                     a.gate_up_weight.grad, a.down_weight.grad)
    a.close()
    b.close()
    return ok


def expect_error(what, fn, kind, *needles):
    try:
        fn()
    except kind as exc:
        missing = [s for s in needles if s not in str(exc)]
        if missing:
            print(f"FAIL {what}: {type(exc).__name__} {exc!s} lacks {missing}", flush=True)
            return False, str(exc)
        return True, str(exc)
    except Exception as exc:  # noqa: BLE001 - the wrong kind is a failure
        print(f"FAIL {what}: {type(exc).__name__}: {exc}", flush=True)
        return False, ""
    print(f"FAIL {what}: no error", flush=True)
    return False, ""


def same_on_every_rank(text, ep):
    """Every rank raised the same text."""
    texts = [None] * ep
    dist.all_gather_object(texts, text)
    return all(t == texts[0] for t in texts)


def case_errors(rank, ep):
    P = problem(ep, 10)
    ok = True
    # constructor: exactly one of the two, positive
    for kw in (dict(local_num_tokens=128, max_local_num_tokens=TCAP), dict(),
               dict(max_local_num_tokens=0), dict(max_local_num_tokens=-3),
               dict(local_num_tokens=0), dict(max_local_num_tokens=True)):
        r, _ = expect_error(f"constructor {kw}", lambda: MegaMoeExperts(
            hidden_size=H, intermediate_size=I, num_experts=E, top_k=K, ep_size=ep,
            ep_group=dist.group.WORLD, **kw), ValueError)
        ok &= r
    # T_cap differing between ranks, fixed on one rank and dynamic on another
    r, t = expect_error("T_cap differs", lambda: MegaMoeExperts(
        hidden_size=H, intermediate_size=I, num_experts=E, top_k=K, ep_size=ep,
        ep_group=dist.group.WORLD, max_local_num_tokens=TCAP + (rank == 1)), MegaMoeError,
        "CONFIG_MISMATCH", "max_local_num_tokens is 200 on rank 0 but 201 on rank 1")
    ok &= r and same_on_every_rank(t, ep)
    kw = dict(local_num_tokens=256) if rank == 1 else dict(max_local_num_tokens=256)
    r, t = expect_error("fixed vs dynamic", lambda: MegaMoeExperts(
        hidden_size=H, intermediate_size=I, num_experts=E, top_k=K, ep_size=ep,
        ep_group=dist.group.WORLD, **kw), MegaMoeError, "CONFIG_MISMATCH",
        "max_local_num_tokens = 256 on rank 0 but local_num_tokens = 256 on rank 1")
    ok &= r and same_on_every_rank(t, ep)
    layer = make(ep)
    set_weights(layer, P, rank, ep)
    ok &= layer.local_num_tokens is None and layer.max_local_num_tokens == TCAP
    big = dict(P, hidden=P["hidden"].repeat(2, 1), ids=P["ids"].repeat(2, 1),
               probs=P["probs"].repeat(2, 1))
    n = counts(1, ep)
    # more than T_cap on the last rank: the same error everywhere, naming T_cap and the count
    last = ep - 1
    m = TCAP + 1 if rank == last else n[rank]
    sl = slice(rank * TCAP, rank * TCAP + m)
    r, t = expect_error("T_r > T_cap", lambda: layer(big["hidden"][sl], big["ids"][sl],
                                                      big["probs"][sl]), InvalidArgumentError,
                        f"rank {last}: INVALID_ARGUMENT", "this call passes 201 tokens",
                        "max_local_num_tokens (T_cap) is 200")
    ok &= r and same_on_every_rank(t, ep)
    # row counts that differ between hidden_states and topk_ids / topk_weights (rank 0)
    x, ids, w, _ = rows(P, rank, n[rank])
    if rank == 0:
        ids = torch.cat([ids, ids[:1]]) if n[rank] > 0 else ids[:0].new_zeros((1, K))
    r, t = expect_error("row counts differ", lambda: layer(x, ids, w), ValueError,
                        "rank 0: INVALID_ARGUMENT", "topk_ids has shape")
    ok &= r and same_on_every_rank(t, ep)
    # the layer still works
    x, ids, w, gout = rows(P, rank, n[rank])
    out = layer(x, ids, w)
    out.backward(gout)
    ok &= check_call(f"after the errors {n}", P, rank, ep, n, x, w, out,
                     layer.gate_up_weight.grad, layer.down_weight.grad)
    layer.close()
    return ok


CASES = {"counts": case_counts, "identity": case_identity, "empty": case_empty,
         "shared": case_shared_outstanding, "errors": case_errors}


def main():
    dist.init_process_group("gloo")
    rank, ep = dist.get_rank(), dist.get_world_size()
    names = sys.argv[1:] or list(CASES)
    failed = []
    for name in names:
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
