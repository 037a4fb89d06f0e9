"""One rank of the torch MegaMoeExperts tests (run by test_experts_torch.py under torchrun with a
gloo process group). Every rank builds the same global problem from a seed, runs its slice
through ``megamoe.MegaMoeExperts`` with autograd, and compares with the reference model
(``megamoe.reference``: the fp32 oracle and the bf16-intermediate variant). Prints one line per case; exits non-zero on the first failure.

    python -m torch.distributed.run --nproc_per_node N torch_experts_worker.py [case ...]
"""
import math
import os
import sys
import traceback

import torch
import torch.distributed as dist

import megamoe
from megamoe import MegaMoeExperts, MegaMoeError
from megamoe import layout, reference

T, H, I, E, K = 128, 64, 32, 8, 2
# The rule of bench/moe_verify.h (docs/moe.md "Accuracy and verification"): every element within
# rtol 2e-2 and atol 2e-3 * max(1, max|ref16|) of the reference with bf16 intermediates, and
# against the fp32 oracle relative L2 <= 1% and max|err| <= 2% of max|ref| (unless clamped).
RTOL, ATOL, REL_L2, REL_MAX = 2e-2, 2e-3, 1e-2, 2e-2


def close(name, got, want, want16, clamp=False):
    got, want, want16 = got.float(), want.float(), want16.float()
    err = (got - want).abs()
    rel_l2 = (err.norm() / want.norm().clamp_min(1e-30)).item()
    rel_max = (err.max() / want.abs().max().clamp_min(1e-30)).item()
    scale = max(1.0, want16.abs().max().item())
    inside = ((got - want16).abs() <= ATOL * scale + RTOL * want16.abs()).float().mean().item()
    oracle_ok = rel_l2 <= REL_L2 and rel_max <= REL_MAX
    ok = bool(torch.isfinite(got).all()) and inside == 1.0 and (oracle_ok or clamp)
    if not ok:
        print(f"FAIL {name}: relL2 {rel_l2:.4f} maxerr/maxref {rel_max:.4f} "
              f"elementwise {100 * inside:.3f}% (atol x {scale:.3g})", flush=True)
    return ok


def problem(ep, route, seed):
    g = torch.Generator().manual_seed(seed)
    n = ep * T
    hidden = (torch.rand(n, H, generator=g) * 2 - 1).bfloat16()
    grad = (torch.rand(n, H, generator=g) * 2 - 1).bfloat16()
    gate_up = ((torch.rand(E, H, 2 * I, generator=g) * 2 - 1) * math.sqrt(6 / (H + 2 * I))).bfloat16()
    down = ((torch.rand(E, I, H, generator=g) * 2 - 1) * math.sqrt(6 / (I + H))).bfloat16()
    ids = route_ids(ep, route, g)
    probs = torch.softmax(torch.rand(n, K, generator=g) * 2 - 1, dim=1)
    return dict(hidden=hidden, grad=grad, gate_up=gate_up, down=down, ids=ids, probs=probs)


def route_ids(ep, route, g):
    """The seed's four patterns (+ "flood": the last rank sends everything to rank 0)."""
    n, L = ep * T, E // ep
    tok = torch.arange(n)
    if route in ("balanced", "flood"):
        ids = torch.stack([(tok + k * (E // K)) % E for k in range(K)], 1)
        if route == "flood":
            last = tok >= (ep - 1) * T
            ids[last] = torch.stack([(tok[last] + k) % L for k in range(K)], 1)
        return ids.int()
    if route == "single":  # every token to rank 0's experts
        return torch.stack([(tok + k) % L for k in range(K)], 1).int()
    if route == "zero":  # odd experts and the last rank's experts get nothing
        allowed = [e for e in range(E) if e % 2 == 0 and e // L != ep - 1]
    else:  # skew: 3/4 of first choices to expert 0
        allowed = list(range(E))
    ids = torch.empty(n, K, dtype=torch.int32)
    for t in range(n):
        perm = torch.randperm(len(allowed), generator=g)[:K]
        row = [allowed[i] for i in perm.tolist()]
        if route == "skew" and torch.rand(1, generator=g).item() < 0.75 and 0 not in row:
            row[0] = 0
        ids[t] = torch.tensor(row)
    return ids


def recv_rows(ids, ep):
    return torch.bincount((ids.long() // (E // ep)).flatten(), minlength=ep)


def make_layer(ep, factor=None, limit=None):
    layer = MegaMoeExperts(local_num_tokens=T, hidden_size=H, intermediate_size=I,
                           num_experts=E, top_k=K, expert_capacity_factor=factor,
                           swiglu_limit=limit, ep_size=ep, ep_group=dist.group.WORLD)
    return layer.to(device="cpu", dtype=torch.bfloat16)


def set_weights(layer, P, rank, ep):
    L = E // ep
    with torch.no_grad():
        layer.gate_up_weight.copy_(P["gate_up"][rank * L:(rank + 1) * L])
        layer.down_weight.copy_(P["down"][rank * L:(rank + 1) * L])


def run_layer(layer, P, rank, tpe=False, ids64=False):
    sl = slice(rank * T, (rank + 1) * T)
    x = P["hidden"][sl].clone().requires_grad_()
    w = P["probs"][sl].clone().requires_grad_()
    ids = P["ids"][sl].long() if ids64 else P["ids"][sl]
    kw = {}
    if tpe:
        kw["tokens_per_expert"] = torch.bincount(ids.long().flatten(), minlength=E)  # int64
    out = layer(x, ids, w, **kw)
    return x, w, out


def check_against_reference(name, layer, P, rank, ep, x, w, out, limit=None):
    L = E // ep
    sl = slice(rank * T, (rank + 1) * T)
    out.backward(P["grad"][sl])
    args = (P["hidden"], P["ids"], P["probs"], P["gate_up"], P["down"])
    lim, clamp = limit or 0.0, bool(limit)
    ref_out, ref16 = (reference.forward(*args, ep=ep, swiglu_limit=lim, bf16_intermediates=b)
                      for b in (False, True))
    g, g16 = (reference.backward(P["grad"], *args, ep=ep, swiglu_limit=lim, bf16_intermediates=b)
              for b in (False, True))
    es = slice(rank * L, (rank + 1) * L)
    ok = close(f"{name} output", out.detach(), ref_out[sl], ref16[sl], clamp)
    ok &= close(f"{name} grad hidden", x.grad, g.hidden[sl], g16.hidden[sl], clamp)
    ok &= close(f"{name} grad topk_weights", w.grad, g.topk_weights[sl], g16.topk_weights[sl],
                clamp)
    ok &= close(f"{name} grad gate_up", layer.gate_up_weight.grad, g.gate_up[es],
                g16.gate_up[es], clamp)
    ok &= close(f"{name} grad down", layer.down_weight.grad, g.down[es], g16.down[es], clamp)
    # experts that received nothing: exact zero grads
    counts = torch.bincount(P["ids"].long().flatten(), minlength=E)[es]
    for j in range(L):
        if counts[j] == 0:
            ok &= bool((layer.gate_up_weight.grad[j] == 0).all() and
                       (layer.down_weight.grad[j] == 0).all())
    # one SGD step against the reference's
    opt = torch.optim.SGD(layer.parameters(), lr=0.5)
    opt.step()
    want1 = P["gate_up"][es].float() - 0.5 * g.gate_up[es]
    want2 = P["down"][es].float() - 0.5 * g.down[es]
    want1_16 = P["gate_up"][es].float() - 0.5 * g16.gate_up[es]
    want2_16 = P["down"][es].float() - 0.5 * g16.down[es]
    ok &= close(f"{name} gate_up after SGD", layer.gate_up_weight.detach(), want1, want1_16, clamp)
    ok &= close(f"{name} down after SGD", layer.down_weight.detach(), want2, want2_16, clamp)
    # the step changed the parameters in place: the layer must re-pack them
    new = dict(P, gate_up=P["gate_up"].clone(), down=P["down"].clone())
    new["gate_up"][es] = layer.gate_up_weight.detach()
    new["down"][es] = layer.down_weight.detach()
    full_gu = [torch.empty_like(new["gate_up"][es]).float() for _ in range(ep)]
    full_dn = [torch.empty_like(new["down"][es]).float() for _ in range(ep)]
    dist.all_gather(full_gu, new["gate_up"][es].float().contiguous())
    dist.all_gather(full_dn, new["down"][es].float().contiguous())
    new["gate_up"] = torch.cat(full_gu).bfloat16()
    new["down"] = torch.cat(full_dn).bfloat16()
    with torch.no_grad():
        out2 = layer(P["hidden"][sl], P["ids"][sl], P["probs"][sl])
    args2 = (new["hidden"], new["ids"], new["probs"], new["gate_up"], new["down"])
    ref2, ref2_16 = (reference.forward(*args2, ep=ep, swiglu_limit=lim, bf16_intermediates=b)
                     for b in (False, True))
    ok &= close(f"{name} output after the step", out2, ref2[sl], ref2_16[sl], clamp)
    return ok


def case_patterns(rank, ep):
    ok = True
    for ri, route in enumerate(("balanced", "zero", "skew", "single")):
        P = problem(ep, route, 100 + ri)
        for factor in (None, 1.5, "forced"):
            name = f"{route} ep{ep} factor {factor}"
            if factor == "forced":
                Q = dict(P, ids=route_ids(ep, "flood", torch.Generator().manual_seed(1)))
                layer = make_layer(ep, 1.0)
                set_weights(layer, Q, rank, ep)
                try:
                    run_layer(layer, Q, rank)
                    print(f"FAIL {name}: no capacity overflow", flush=True)
                    ok = False
                except MegaMoeError as exc:
                    ok &= exc.name == "CAPACITY_OVERFLOW" and "capacity overflow" in str(exc)
                layer.close()
                continue
            layer = make_layer(ep, factor)
            set_weights(layer, P, rank, ep)
            cap = MegaMoeExperts.capacity_rows(ep, T, K, factor)
            if recv_rows(P["ids"], ep).max().item() > cap:
                try:
                    run_layer(layer, P, rank)
                    print(f"FAIL {name}: expected a capacity overflow", flush=True)
                    ok = False
                except MegaMoeError as exc:
                    ok &= exc.name == "CAPACITY_OVERFLOW"
            else:
                x, w, out = run_layer(layer, P, rank)
                ok &= check_against_reference(name, layer, P, rank, ep, x, w, out)
            layer.close()
    return ok


def case_inputs(rank, ep):
    P = problem(ep, "skew", 7)
    P["probs"] = P["probs"].bfloat16()  # bf16 router weights
    layer = make_layer(ep)
    set_weights(layer, P, rank, ep)
    x, w, out = run_layer(layer, P, rank, tpe=True, ids64=True)
    ok = w.grad is None and out.dtype == torch.bfloat16
    ok &= check_against_reference("int64 ids + histogram + bf16 weights", layer, P, rank, ep,
                                  x, w, out)
    layer.close()
    # hidden states of shape [..., H] keep their shape
    layer = make_layer(ep)
    set_weights(layer, P, rank, ep)
    sl = slice(rank * T, (rank + 1) * T)
    out = layer(P["hidden"][sl].reshape(2, T // 2, H), P["ids"][sl], P["probs"][sl])
    ok &= tuple(out.shape) == (2, T // 2, H)
    layer.close()
    return ok


def case_linear_layout(rank, ep):
    """Ordinary per-expert nn.Linear gate/up/down weights, converted with megamoe.layout,
    against a plain fp32 torch MoE on the same weights."""
    L = E // ep
    torch.manual_seed(5)  # same on every rank
    gate = [torch.nn.Linear(H, I, bias=False) for _ in range(E)]
    up = [torch.nn.Linear(H, I, bias=False) for _ in range(E)]
    down = [torch.nn.Linear(I, H, bias=False) for _ in range(E)]
    P = problem(ep, "balanced", 9)
    with torch.no_grad():
        gw = torch.stack([m.weight for m in gate]).bfloat16()
        uw = torch.stack([m.weight for m in up]).bfloat16()
        dw = torch.stack([m.weight for m in down]).bfloat16()
    layer = make_layer(ep)
    with torch.no_grad():
        layer.gate_up_weight.copy_(layout.gate_up_from_linear(gw[rank * L:(rank + 1) * L],
                                                              uw[rank * L:(rank + 1) * L]))
        layer.down_weight.copy_(layout.down_from_linear(dw[rank * L:(rank + 1) * L]))
    sl = slice(rank * T, (rank + 1) * T)
    x, ids, p = P["hidden"][sl].float(), P["ids"][sl].long(), P["probs"][sl]
    want, want16 = torch.zeros(T, H), torch.zeros(T, H)
    b16 = lambda v: v.bfloat16().float()  # noqa: E731  (a bf16-stored intermediate)
    silu = torch.nn.functional.silu
    for t in range(T):
        for k in range(K):
            e = ids[t, k].item()
            g_, u_ = x[t] @ gw[e].float().T, x[t] @ uw[e].float().T
            want[t] += p[t, k] * ((silu(g_) * u_) @ dw[e].float().T)
            want16[t] += p[t, k] * b16(b16(silu(b16(g_)) * b16(u_)) @ dw[e].float().T)
    with torch.no_grad():
        out = layer(P["hidden"][sl], P["ids"][sl], p)
    ok = close("nn.Linear layout", out, want, want16)
    layer.close()
    return ok


def case_sharing(rank, ep):
    """Two layers share resources; two outstanding forwards; backwards in reverse order."""
    P1, P2 = problem(ep, "skew", 21), problem(ep, "zero", 22)
    a, b = make_layer(ep), make_layer(ep)
    MegaMoeExperts.share_execution_resources([a, b])
    ok = a.info()["group_layers"] == 2
    set_weights(a, P1, rank, ep)
    set_weights(b, P2, rank, ep)
    xa, wa, oa = run_layer(a, P1, rank)
    xb, wb, ob = run_layer(b, P2, rank)
    sl = slice(rank * T, (rank + 1) * T)
    ob.backward(P2["grad"][sl])
    oa.backward(P1["grad"][sl])
    for name, layer, P, x, w, out in (("shared a", a, P1, xa, wa, oa), ("shared b", b, P2, xb, wb, ob)):
        L = E // ep
        es = slice(rank * L, (rank + 1) * L)
        args = (P["hidden"], P["ids"], P["probs"], P["gate_up"], P["down"])
        g, g16 = (reference.backward(P["grad"], *args, ep=ep, bf16_intermediates=b)
                  for b in (False, True))
        ref, ref16 = (reference.forward(*args, ep=ep, bf16_intermediates=b) for b in (False, True))
        ok &= close(f"{name} output", out.detach(), ref[sl], ref16[sl])
        ok &= close(f"{name} grad hidden", x.grad, g.hidden[sl], g16.hidden[sl])
        ok &= close(f"{name} grad topk", w.grad, g.topk_weights[sl], g16.topk_weights[sl])
        ok &= close(f"{name} grad gate_up", layer.gate_up_weight.grad, g.gate_up[es],
                    g16.gate_up[es])
        ok &= close(f"{name} grad down", layer.down_weight.grad, g.down[es], g16.down[es])
    # sharing after the first forward is refused
    try:
        MegaMoeExperts.share_execution_resources([a, b])
        ok = False
    except MegaMoeError as exc:
        ok &= exc.name == "INVALID_STATE"
    b.close()
    a.close()
    return ok


def case_close_and_errors(rank, ep):
    ok = True
    P = problem(ep, "balanced", 3)
    layers = [make_layer(ep) for _ in range(3)]
    for l in layers:
        set_weights(l, P, rank, ep)
        with torch.no_grad():
            run_layer(l, P, rank)
    for i in (2, 0, 1):  # not the creation order
        layers[i].close()
    layers[0].close()  # idempotent
    try:
        run_layer(layers[1], P, rank)
        ok = False
    except MegaMoeError as exc:
        ok &= "after close" in str(exc)
    # settings that differ between ranks
    try:
        MegaMoeExperts(T, H * (2 if rank == 1 else 1), I, E, K, ep_size=ep,
                       ep_group=dist.group.WORLD)
        ok = False
    except MegaMoeError as exc:
        ok &= exc.name == "CONFIG_MISMATCH" and "hidden_size" in str(exc)
    for kwargs, status in ((dict(local_num_tokens=100), "INVALID_ARGUMENT"),
                           (dict(schedule="O7"), "INVALID_ARGUMENT"),
                           (dict(expert_capacity_factor=0.5), ValueError)):
        args = dict(local_num_tokens=T, hidden_size=H, intermediate_size=I, num_experts=E,
                    top_k=K, ep_size=ep, ep_group=dist.group.WORLD)
        args.update(kwargs)
        try:
            MegaMoeExperts(**args)
            ok = False
        except MegaMoeError as exc:
            ok &= exc.name == status
        except ValueError:  # checked in Python, before any collective (as the original)
            ok &= status is ValueError
    try:
        MegaMoeExperts(T, H, I, E, K, ep_size=ep + 1, ep_group=dist.group.WORLD)
        ok = False
    except ValueError:
        pass
    return ok


CASES = {"patterns": case_patterns, "inputs": case_inputs, "layout": case_linear_layout,
         "sharing": case_sharing, "close": case_close_and_errors}


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
        # every rank learns whether any rank failed
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
