"""MoE dispatch -> per-expert compute -> combine with megamoe.ops, the way vllm-ascend's MC2 path
drives torch_npu (TokenDispatcherWithMC2 + the grouped MLP over expert_token_nums), on CPUs.

    build/release/bin/megamoe launch -n 2 -- /usr/bin/python3 examples/python/dispatch_combine.py

Every rank: route its tokens (top-k of random logits), dispatch them with quant_mode 2 (int8 rows
plus one fp32 scale per row), run its local experts (SwiGLU MLPs) on the rows of each expert --
expert_token_nums gives how many rows each local expert got, in order -- then combine the
results back, weighted by the router's probabilities. The result is checked against the same
MoE computed with plain torch on the rank's own tokens (the same int8 row quantisation, fp32
maths), with megamoe's tolerance (rtol 2e-2, atol 2e-3). Prints one line per rank and exits 1
on a mismatch.
"""
import os
import sys

import torch
import torch.distributed as dist

try:
    import megamoe.comm
except ImportError:  # run from a checkout without PYTHONPATH
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))
    import megamoe.comm
import megamoe.ops as torch_npu  # vllm-ascend calls these through torch_npu on an NPU

NUM_TOKENS, HIDDEN, INTERMEDIATE, NUM_EXPERTS, TOP_K = 32, 256, 128, 8, 2


def expert_weights(num_experts):
    """Every rank builds every expert from one seed (only the reference needs the remote ones)."""
    g = torch.Generator().manual_seed(1234)
    w13 = torch.randn(num_experts, HIDDEN, 2 * INTERMEDIATE, generator=g) / HIDDEN ** 0.5
    w2 = torch.randn(num_experts, INTERMEDIATE, HIDDEN, generator=g) / INTERMEDIATE ** 0.5
    return w13, w2


def swiglu_mlp(x, w13, w2):
    gate, up = (x @ w13).chunk(2, dim=-1)
    return (torch.nn.functional.silu(gate) * up) @ w2


def router(rank):
    g = torch.Generator().manual_seed(100 + rank)
    hidden_states = torch.randn(NUM_TOKENS, HIDDEN, generator=g).to(torch.bfloat16)
    logits = torch.randn(NUM_TOKENS, NUM_EXPERTS, generator=g)
    topk_weights, topk_ids = torch.softmax(logits, dim=-1).topk(TOP_K, dim=-1)
    return hidden_states, topk_weights, topk_ids.to(torch.int32)


def int8_per_token(x):
    """quant_mode 2 in plain torch: q = round(x * 127 / max|x|), scale = max|x| / 127."""
    xf = x.float()
    d = 127.0 / xf.abs().amax(dim=-1, keepdim=True)
    return torch.round(xf * d).clamp(-128, 127), 1.0 / d


def main():
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    group_name = megamoe.comm.group_name(dist.group.WORLD)  # vllm-ascend: get_hccl_comm_name
    local_num = NUM_EXPERTS // world
    w13, w2 = expert_weights(NUM_EXPERTS)
    hidden_states, topk_weights, topk_ids = router(rank)

    # ---- dispatch (vllm-ascend get_dispatch_mc2_kwargs, A3 / A5 arguments)
    kwargs_mc2 = {
        "x": hidden_states,
        "expert_ids": topk_ids,
        "expert_shard_type": 0,
        "shared_expert_rank_num": 0,
        "moe_expert_num": NUM_EXPERTS,
        "global_bs": 0,
        "expert_token_nums_type": 1,  # counts per local expert
        "scales": None,
        "quant_mode": 2,
        "group_ep": group_name,
        "ep_world_size": world,
        "ep_rank_id": rank,
        "group_tp": group_name,
        "tp_world_size": 1,
        "tp_rank_id": 0,
    }
    output = torch_npu.npu_moe_distribute_dispatch_v2(**kwargs_mc2)
    (expand_x, dynamic_scale, assist_info_for_combine, expert_token_nums, ep_recv_counts,
     tp_recv_counts, expand_scales) = output[0:7]

    # ---- the experts: a grouped MLP over the rows of each local expert (group_list)
    group_list = expert_token_nums.tolist()
    x = expand_x.float() * dynamic_scale[:, None]  # dequantise (npu_dequant_swiglu_quant's input)
    hidden_out = torch.zeros(expand_x.shape[0], HIDDEN, dtype=torch.bfloat16)
    start = 0
    for local, count in enumerate(group_list):
        e = rank * local_num + local
        rows = slice(start, start + count)
        hidden_out[rows] = swiglu_mlp(x[rows], w13[e], w2[e]).to(torch.bfloat16)
        start += count

    # ---- combine (vllm-ascend get_combine_mc_kwargs)
    kwargs_mc2 = {
        "expand_x": hidden_out,
        "expert_ids": topk_ids,
        "expert_scales": topk_weights.to(torch.float32),
        "expert_shard_type": 0,
        "shared_expert_rank_num": 0,
        "moe_expert_num": NUM_EXPERTS,
        "global_bs": 0,
        "ep_send_counts": ep_recv_counts,
        "group_ep": group_name,
        "ep_world_size": world,
        "ep_rank_id": rank,
        "expand_scales": expand_scales,
        "comm_quant_mode": 0,
        "assist_info_for_combine": assist_info_for_combine,
        "tp_send_counts": torch.empty(1, dtype=torch.int32),  # dispatch_with_quant
        "group_tp": group_name,
        "tp_world_size": 1,
        "tp_rank_id": 0,
    }
    combined = torch_npu.npu_moe_distribute_combine_v2(**kwargs_mc2)

    # ---- the same MoE in plain torch, on this rank's tokens
    q, scale = int8_per_token(hidden_states)
    xq = q * scale
    want = torch.zeros(NUM_TOKENS, HIDDEN)
    for t in range(NUM_TOKENS):
        for k in range(TOP_K):
            e = int(topk_ids[t, k])
            y = swiglu_mlp(xq[t:t + 1], w13[e], w2[e]).to(torch.bfloat16).float()
            want[t] += topk_weights[t, k] * y[0]
    counts = torch.zeros(NUM_EXPERTS, dtype=torch.int64)  # rows per expert over every rank
    for r in range(world):
        counts += torch.bincount(router(r)[2].flatten().long(), minlength=NUM_EXPERTS)
    ok_counts = group_list == counts[rank * local_num:(rank + 1) * local_num].tolist()
    got = combined.float()
    ok = ok_counts and torch.allclose(got, want, rtol=2e-2, atol=2e-3)
    err = (got - want).abs().max().item()
    print(f"rank {rank}: {'ok' if ok else 'MISMATCH'} dispatch quant_mode 2 -> {len(group_list)} "
          f"local experts {group_list} rows -> combine {tuple(combined.shape)} "
          f"{combined.dtype}; max |combine - torch| = {err:.2e}", flush=True)
    torch_npu.release()
    megamoe.comm.shutdown()
    dist.destroy_process_group()
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
