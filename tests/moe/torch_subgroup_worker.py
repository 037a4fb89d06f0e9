"""One rank of the torch EP-subgroup test (hosts_experts_cases.py, under `megamoe launch`, gloo):

    torch_subgroup_worker.py alone DIR     2 ranks, EP = the world: config a, then config b
    torch_subgroup_worker.py groups DIR    4 ranks: EP groups {0,1} {2,3} (new_group), results
                                           in DIR/block, then EP groups {0,2} {1,3} in DIR/strided
    torch_subgroup_worker.py lifecycle DIR 4 ranks, EP groups {0,1} {2,3}: group 0 runs config a
                                           twice (two layers, one after the other), group 1 once b

In a 4-rank job group 0 runs config a (3 calls) and group 1 config b (2 calls, other shapes);
every megamoe call is made by the group's members only. Each call (forward + backward with
autograd, both schedules) is checked against the reference (megamoe.reference) and its bytes
(output, grad hidden, grad topk_weights, grad gate_up, grad down) are written to
DIR/<cfg>.ep2.r<EP rank>.<schedule>.bin, so the test can compare them with the EP-2 job alone.
"""
import os
import sys

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_experts_worker import close  # noqa: E402  (the bench/moe_verify.h rule)

import megamoe  # noqa: E402
from megamoe import MegaMoeExperts, reference  # noqa: E402

# name: (T, H, I, E, K, calls)
CONFIGS = {"a": (128, 64, 32, 8, 2, 3), "b": (256, 96, 64, 4, 3, 2)}


def problem(cfg, ep, call):
    T, H, I, E, K, _ = CONFIGS[cfg]
    g = torch.Generator().manual_seed(1000 * ord(cfg) + call)
    n = ep * T
    return dict(
        hidden=(torch.rand(n, H, generator=g) * 2 - 1).bfloat16(),
        grad=(torch.rand(n, H, generator=g) * 2 - 1).bfloat16(),
        gate_up=((torch.rand(E, H, 2 * I, generator=g) * 2 - 1) * (6 / (H + 2 * I)) ** 0.5).bfloat16(),
        down=((torch.rand(E, I, H, generator=g) * 2 - 1) * (6 / (I + H)) ** 0.5).bfloat16(),
        # every call routes differently (skewed towards expert `call`)
        ids=torch.stack([torch.randperm(E, generator=g)[:K] for _ in range(n)]).int()
        if call % 2 else ((torch.arange(n)[:, None] * (call + 1) + torch.arange(K)[None]) % E).int(),
        probs=torch.softmax(torch.rand(n, K, generator=g) * 2 - 1, dim=1))


def run_config(cfg, group, ep_rank, out_dir):
    T, H, I, E, K, calls = CONFIGS[cfg]
    ep, L = 2, E // 2
    ok = True
    for sched in ("O0", "O1"):
        layer = MegaMoeExperts(T, H, I, E, K, ep_size=ep, ep_group=group, schedule=sched,
                               workers=2, create_parameters=False)
        with open(os.path.join(out_dir, f"{cfg}.ep{ep}.r{ep_rank}.{sched}.bin"), "wb") as f:
            for call in range(calls):
                P = problem(cfg, ep, call)
                es, sl = slice(ep_rank * L, (ep_rank + 1) * L), slice(ep_rank * T, (ep_rank + 1) * T)
                layer.gate_up_weight = torch.nn.Parameter(P["gate_up"][es].clone())
                layer.down_weight = torch.nn.Parameter(P["down"][es].clone())
                x = P["hidden"][sl].clone().requires_grad_()
                w = P["probs"][sl].clone().requires_grad_()
                out = layer(x, P["ids"][sl], w)
                out.backward(P["grad"][sl])
                args = (P["hidden"], P["ids"], P["probs"], P["gate_up"], P["down"])
                ref, ref16 = (reference.forward(*args, ep=ep, bf16_intermediates=b) for b in (False, True))
                g, g16 = (reference.backward(P["grad"], *args, ep=ep, bf16_intermediates=b)
                          for b in (False, True))
                name = f"{cfg} {sched} call {call}"
                ok &= close(f"{name} output", out.detach(), ref[sl], ref16[sl])
                ok &= close(f"{name} grad hidden", x.grad, g.hidden[sl], g16.hidden[sl])
                ok &= close(f"{name} grad topk_weights", w.grad, g.topk_weights[sl], g16.topk_weights[sl])
                ok &= close(f"{name} grad gate_up", layer.gate_up_weight.grad, g.gate_up[es], g16.gate_up[es])
                ok &= close(f"{name} grad down", layer.down_weight.grad, g.down[es], g16.down[es])
                for t in (out.detach(), x.grad, w.grad, layer.gate_up_weight.grad,
                          layer.down_weight.grad):
                    f.write(t.contiguous().view(torch.uint8).numpy().tobytes())
        layer.close()
    return ok


def main():
    mode, out_dir = sys.argv[1], sys.argv[2]
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    if mode == "alone":
        assert world == 2
        ok = all([run_config("a", dist.group.WORLD, rank, out_dir),
                  run_config("b", dist.group.WORLD, rank, out_dir)])
    elif mode == "lifecycle":
        # replica 0 closes a layer and builds the next while replica 1 still trains
        assert world == 4
        groups = [dist.new_group([0, 1]), dist.new_group([2, 3])]
        g = rank // 2
        ok = run_config("a", groups[0], rank, out_dir) if g == 0 else \
            run_config("b", groups[1], rank - 2, out_dir)
        if g == 0:
            ok &= run_config("a", groups[0], rank, out_dir)
    else:  # both layouts, one after the other, in one job
        assert world == 4 and mode == "groups"
        ok = True
        for layout, members in (("block", [[0, 1], [2, 3]]), ("strided", [[0, 2], [1, 3]])):
            d = os.path.join(out_dir, layout)
            os.makedirs(d, exist_ok=True)
            groups = [dist.new_group(m) for m in members]  # torch: every rank makes every group
            g = 0 if rank in members[0] else 1
            ok &= run_config("ab"[g], groups[g], members[g].index(rank), d)
            print(f"{'ok' if ok else 'FAILED'} rank {rank} {layout}", flush=True)
    megamoe.comm.shutdown()
    print(f"{'ok' if ok else 'FAILED'} rank {rank} {mode} done", flush=True)
    dist.barrier()
    dist.destroy_process_group()
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
