"""One rank of the hot-expert replica training test (run by test_experts_replicas.py under
torchrun with a gloo group): two copies of a small MoE block (a router biased towards expert
0, so one rank owns most of the work, and MegaMoeExperts) start from the same weights, one
with replica_slots_per_rank=0 and one with 2, and take the same AdamW steps. Outputs match
bit for bit (rows are computed the same wherever they are), gradients within the reference
rule, and after the steps losses and weights track each other; the plan in info() moves rows,
is the same on every rank and changes nothing when the routing is balanced."""
import sys
import traceback

import torch
import torch.distributed as dist

from megamoe import MegaMoeExperts

T, H, I, E, K = 256, 64, 32, 8, 2
STEPS, LR = 5, 1e-3


class Block(torch.nn.Module):
    def __init__(self, replicas, ep):
        super().__init__()
        self.router = torch.nn.Linear(H, E)
        self.experts = MegaMoeExperts(T, H, I, E, K, ep_size=ep, ep_group=dist.group.WORLD,
                                      replica_slots_per_rank=replicas)

    def forward(self, x):
        logits = self.router(x.float())
        probs, ids = torch.softmax(logits, dim=-1).topk(K, dim=-1)
        probs = probs / probs.sum(-1, keepdim=True)
        return self.experts(x, ids, probs)


def build(replicas, ep, rank, skew):
    torch.manual_seed(1234 + rank)  # experts: rank-local weights; router: the same everywhere
    b = Block(replicas, ep).to(dtype=torch.bfloat16)
    b.router = b.router.float()
    g = torch.Generator().manual_seed(7)
    with torch.no_grad():
        b.router.weight.copy_(torch.randn(E, H, generator=g) * 0.05)
        b.router.bias.zero_()
        if skew:
            b.router.bias[0] = 3.0  # most tokens pick expert 0 (rank 0) first
    return b


def main():
    dist.init_process_group("gloo")
    rank, ep = dist.get_rank(), dist.get_world_size()
    g = torch.Generator().manual_seed(99 + rank)
    x = (torch.rand(T, H, generator=g) * 2 - 1).bfloat16()
    target = (torch.rand(T, H, generator=g) * 2 - 1).float() * 0.1

    # settings are checked
    for bad in (-1, 65, 1.5):
        try:
            MegaMoeExperts(T, H, I, E, K, ep_size=ep, ep_group=dist.group.WORLD,
                           replica_slots_per_rank=bad)
        except (ValueError, RuntimeError) as e:
            assert "replica_slots_per_rank" in str(e), e
        else:
            raise AssertionError(f"replica_slots_per_rank={bad} was accepted")
    print(f"rank {rank} case settings: ok", flush=True)

    blocks = [build(0, ep, rank, True), build(2, ep, rank, True)]
    blocks[1].load_state_dict(blocks[0].state_dict())
    opts = [torch.optim.AdamW(b.parameters(), lr=LR, weight_decay=0.01) for b in blocks]
    losses = [[], []]
    for step in range(STEPS):
        outs = []
        for i, (b, o) in enumerate(zip(blocks, opts)):
            o.zero_grad()
            out = b(x)
            loss = ((out.float() - target) ** 2).mean()
            loss.backward()
            outs.append(out.detach())
            lt = loss.detach().clone()
            dist.all_reduce(lt)
            losses[i].append(lt.item() / ep)
        if step == 0:
            # the first step from equal weights: the same output bits, gradients close
            assert torch.equal(outs[0], outs[1]), "outputs differ with replicas"
            for (n, p0), p1 in zip(blocks[0].named_parameters(), blocks[1].parameters()):
                d = (p0.grad.float() - p1.grad.float()).abs().max().item()
                s = max(1e-6, p0.grad.float().abs().max().item())
                assert d <= 2e-2 * s, f"step 0 grad {n}: max diff {d} vs max {s}"
            info = blocks[1].experts.info()
            assert info["replica_slots"] == 2
            assert info["last_guests"] > 0 and info["last_rows_moved"] > 0, info
            assert info["last_max_rows"] < info["last_max_rows_plain"], info
            plans = [None] * ep
            dist.all_gather_object(plans, (info["replicas"], info["last_max_rows"]))
            assert all(p == plans[0] for p in plans), plans
            print(f"rank {rank} plan: {info['replicas']} slowest rank "
                  f"{info['last_max_rows_plain']} -> {info['last_max_rows']} rows", flush=True)
            assert blocks[0].experts.info()["replicas"] == []
        for o in opts:
            o.step()
    for a, b in zip(losses[0], losses[1]):
        assert abs(a - b) <= 1e-3 * max(abs(a), 1e-6), (losses[0], losses[1])
    worst = 0.0
    for (n, p0), p1 in zip(blocks[0].named_parameters(), blocks[1].parameters()):
        d = (p0.float() - p1.float()).abs().max().item()
        worst = max(worst, d)
        # AdamW moves a weight by about lr per step: tiny gradient differences can flip the
        # direction of a near-zero gradient's update at most, and bf16 rounding adds an ulp
        assert d <= 2 * STEPS * LR + 1e-2 * p0.float().abs().max().item(), (n, d)
    assert losses[0][-1] < losses[0][0], losses[0]
    print(f"rank {rank} losses without {['%.6f' % v for v in losses[0]]} with "
          f"{['%.6f' % v for v in losses[1]]}, worst weight difference {worst:.2e}", flush=True)
    print(f"rank {rank} case training: ok", flush=True)

    # balanced routing: the plan moves nothing and the results are bit-identical
    bal = [build(0, ep, rank, False), build(2, ep, rank, False)]
    bal[1].load_state_dict(bal[0].state_dict())
    ids = torch.stack([(torch.arange(T) + rank * T + k * (E // K)) % E for k in range(K)], 1)
    probs = torch.full((T, K), 1.0 / K)
    res = []
    for b in bal:
        xx = x.clone().requires_grad_()
        out = b.experts(xx, ids, probs)
        out.float().sum().backward()
        res.append((out.detach(), xx.grad, b.experts.gate_up_weight.grad,
                    b.experts.down_weight.grad))
    assert bal[1].experts.info()["last_guests"] == 0
    for u, v in zip(*res):
        assert torch.equal(u, v)
    print(f"rank {rank} case balanced: ok", flush=True)
    for b in blocks + bal:
        b.experts.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    try:
        main()
    except Exception:
        traceback.print_exc()
        sys.exit(1)
