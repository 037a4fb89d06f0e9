"""One rank of `megamoe bench companion` (run under `megamoe launch -n R`): a real caller's MoE
block through megamoe.ops (torch_npu -> megamoe.ops) beside the same block as a CPU user writes
it in plain torch, on the same routing and weights, timed in one run.

Blocks:
  mc2_w8a8  vLLM-Ascend MC2 W8A8 (moe_mlp.quant_apply_mlp, the non-fused MC2 branch):
            gating_top_k -> dispatch_v2 (quant_mode 2) -> npu_grouped_matmul int8 -> int32 ->
            npu_dequant_swiglu_quant -> npu_grouped_matmul (bf16 per-channel scale x
            per-token scale) -> combine_v2.
  mc2_bf16  vLLM-Ascend MC2 bf16 (unquant_apply_mlp): gating_top_k -> dispatch_v2 -> gmm
            (w13 view) -> swiglu -> gmm -> combine_v2.
Baselines (the same block in plain torch: the experts as a per-expert Python loop over
F.linear with bf16 weights — the W8A8 ones dequantised to bf16 once at load — and torch's
SiLU):
  torch       tokens moved by megamoe's dispatch_v2 / combine_v2 (bf16, quant_mode 0): the
              strongest plain-torch block (only the experts differ);
  torch_gloo  tokens moved by torch.distributed all_to_all_single over gloo (what a CPU user
              without megamoe has).
Times: per iteration every rank starts after a barrier and the slowest rank's time counts;
the median over the iterations. Output: one JSON line per (phase, impl) on rank 0.
"""
import argparse
import json
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F

RANK = int(os.environ.get("RANK", "0"))
WORLD = int(os.environ.get("WORLD_SIZE", "1"))
BF = torch.bfloat16


def parse():
    p = argparse.ArgumentParser()
    p.add_argument("--block", default="mc2_w8a8", choices=["mc2_w8a8", "mc2_bf16"])
    p.add_argument("--phases", default="decode,prefill")
    p.add_argument("--decode-tokens", type=int, default=16)
    p.add_argument("--prefill-tokens", type=int, default=512)
    p.add_argument("--hidden", type=int, default=2048)
    p.add_argument("--intermediate", type=int, default=1024)
    p.add_argument("--experts", type=int, default=64)
    p.add_argument("--top-k", type=int, default=8)
    p.add_argument("--iters", type=int, default=10)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--impls", default="megamoe,torch,torch_gloo")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default="")
    return p.parse_args()


class Weights:
    """The local experts' weights: int8 + per-channel scales in vLLM's W8A8 layout (w13 [L, H,
    2I], w2 [L, I, H], scales fp32 [L, 2I] and bf16 [L, H]) and their bf16 dequantisation
    [out, in] for the plain-torch block (made once, as a user loading the model does)."""

    def __init__(self, a, lo, hi):
        h, i = a.hidden, a.intermediate
        self.w13_q, self.w13_s, self.w2_q, self.w2_s = [], [], [], []
        for e in range(lo, hi):
            g = torch.Generator().manual_seed(a.seed * 1000 + e)
            w13 = torch.randn(h, 2 * i, generator=g) / h ** 0.5
            w2 = torch.randn(i, h, generator=g) / i ** 0.5
            for w, qs, ss in ((w13, self.w13_q, self.w13_s), (w2, self.w2_q, self.w2_s)):
                s = w.abs().amax(0) / 127.0
                qs.append(torch.round(w / s).clamp(-127, 127).to(torch.int8))
                ss.append(s)
        self.w13_q = torch.stack(self.w13_q)              # [L, H, 2I] int8
        self.w13_s = torch.stack(self.w13_s)              # [L, 2I] fp32
        self.w2_q = torch.stack(self.w2_q)                # [L, I, H] int8
        self.w2_s = torch.stack(self.w2_s).to(BF)         # [L, H] bf16 (the output dtype)
        # bf16 models of the same weights: [L, H, 2I] / [L, I, H] (megamoe bf16) and the
        # nn.Linear [out, in] tensors the plain-torch loop uses
        self.w13_bf = (self.w13_q.float() * self.w13_s.unsqueeze(1)).to(BF)
        self.w2_bf = (self.w2_q.float() * self.w2_s.float().unsqueeze(1)).to(BF)
        self.lin13 = [w.t().contiguous() for w in self.w13_bf]
        self.lin2 = [w.t().contiguous() for w in self.w2_bf]


def route(ops, logits, k, use_ops):
    if use_ops:
        w, ids, _ = ops.npu_moe_gating_top_k(logits, k=k, norm_type=0, renorm=0)
    else:
        w, ids = torch.softmax(logits, -1).topk(k, -1)
        ids = ids.to(torch.int32)
    return w / w.sum(-1, keepdim=True), ids


def block_megamoe(ops, a, wt, x, logits, group):
    e = a.experts
    w, ids = route(ops, logits, a.top_k, True)
    quant = a.block == "mc2_w8a8"
    (expand_x, dynamic_scale, assist, group_list, ep_recv_counts, tp_recv_counts,
     _) = ops.npu_moe_distribute_dispatch_v2(
        x=x, expert_ids=ids, group_ep=group, ep_world_size=WORLD, ep_rank_id=RANK,
        moe_expert_num=e, quant_mode=2 if quant else 0, global_bs=0,
        expert_token_nums_type=0)
    if quant:
        hs = ops.npu_grouped_matmul(x=[expand_x], weight=[wt.w13_q], split_item=3,
                                    group_list_type=0, group_type=0, group_list=group_list,
                                    output_dtype=torch.int32)[0]
        counts = torch.diff(group_list, prepend=group_list.new_zeros(1))
        hs, swiglu_out_scale = ops.npu_dequant_swiglu_quant(
            x=hs, weight_scale=wt.w13_s, activation_scale=dynamic_scale, bias=None,
            quant_scale=None, quant_offset=None, group_index=counts, activate_left=True,
            quant_mode=1)
        hs = ops.npu_grouped_matmul(x=[hs], weight=[wt.w2_q], scale=[wt.w2_s],
                                    per_token_scale=[swiglu_out_scale], split_item=2,
                                    group_list_type=0, group_type=0, group_list=group_list,
                                    output_dtype=wt.w2_s.dtype)[0]
    else:
        hs = ops.npu_grouped_matmul(x=[expand_x], weight=[wt.w13_bf], split_item=2,
                                    group_list_type=0, group_type=0, group_list=group_list)[0]
        hs = ops.npu_swiglu(hs)
        hs = ops.npu_grouped_matmul(x=[hs], weight=[wt.w2_bf], split_item=2,
                                    group_list_type=0, group_type=0, group_list=group_list)[0]
    return ops.npu_moe_distribute_combine_v2(
        expand_x=hs, expert_ids=ids, assist_info_for_combine=assist,
        ep_send_counts=ep_recv_counts, expert_scales=w.float(), group_ep=group,
        ep_world_size=WORLD, ep_rank_id=RANK, moe_expert_num=e)


def experts_loop(wt, rows, counts, inter):
    """The plain-torch experts: a loop over the local experts."""
    out = torch.empty_like(rows)
    start = 0
    for le, c in enumerate(counts):
        if c:
            h = F.linear(rows[start:start + c], wt.lin13[le])
            a = F.silu(h[:, :inter]) * h[:, inter:]
            out[start:start + c] = F.linear(a, wt.lin2[le])
        start += c
    return out


def block_torch(ops, a, wt, x, logits, group):
    w, ids = route(ops, logits, a.top_k, False)
    (expand_x, _, assist, counts, ep_recv_counts, _, _) = ops.npu_moe_distribute_dispatch_v2(
        x=x, expert_ids=ids, group_ep=group, ep_world_size=WORLD, ep_rank_id=RANK,
        moe_expert_num=a.experts, quant_mode=0, expert_token_nums_type=1)
    ys = experts_loop(wt, expand_x, counts.tolist(), a.intermediate)
    return ops.npu_moe_distribute_combine_v2(
        expand_x=ys, expert_ids=ids, assist_info_for_combine=assist,
        ep_send_counts=ep_recv_counts, expert_scales=w.float(), group_ep=group,
        ep_world_size=WORLD, ep_rank_id=RANK, moe_expert_num=a.experts)


def _a2a(rows, send):
    sc = torch.tensor(send, dtype=torch.int64)
    rc = torch.empty_like(sc)
    dist.all_to_all_single(rc, sc)
    out = torch.empty((int(rc.sum()), rows.shape[1]), dtype=rows.dtype)
    dist.all_to_all_single(out.view(torch.int32), rows.contiguous().view(torch.int32),
                           rc.tolist(), sc.tolist())  # gloo has no bf16: the bits, two per int32
    return out, rc.tolist()


def block_torch_gloo(ops, a, wt, x, logits, group):
    """Everything in plain torch: sort the pairs by expert, all_to_all the rows, the expert
    loop, all_to_all back, weighted sum."""
    e, k = a.experts, a.top_k
    local = e // WORLD
    w, ids = route(ops, logits, k, False)
    flat = ids.reshape(-1).long()
    order = torch.argsort(flat, stable=True)
    rows = x[order // k]
    per_expert = torch.bincount(flat, minlength=e)
    send = per_expert.reshape(WORLD, local).sum(1).tolist()
    recv_rows, recv = _a2a(rows, send)
    parts = [torch.empty(e, dtype=torch.int64) for _ in range(WORLD)]
    dist.all_gather(parts, per_expert)
    per_src = torch.stack(parts)[:, RANK * local:(RANK + 1) * local]  # [src, le]
    # received rows are (source, expert): regroup by expert for the loop
    src_exp = torch.repeat_interleave(
        torch.arange(WORLD * local) % local, per_src.reshape(-1))
    by_exp = torch.argsort(src_exp, stable=True)
    ys = torch.empty_like(recv_rows)
    ys[by_exp] = experts_loop(wt, recv_rows[by_exp], per_src.sum(0).tolist(), a.intermediate)
    back, _ = _a2a(ys, recv)
    out = torch.zeros(x.shape, dtype=torch.float32)
    out.index_add_(0, order // k, back.float() * w.reshape(-1)[order].unsqueeze(1))
    return out.to(BF)


def timed(fn, iters, warmup):
    res = None
    times = []
    for i in range(warmup + iters):
        dist.barrier()
        t0 = time.perf_counter()
        res = fn()
        dt = time.perf_counter() - t0
        if i >= warmup:
            times.append(dt)
    allt = [None] * WORLD
    dist.all_gather_object(allt, times)
    slowest = sorted(max(allt[r][i] for r in range(WORLD)) for i in range(iters))
    return res, slowest[len(slowest) // 2]


def main():
    a = parse()
    torch.set_num_threads(a.threads)
    dist.init_process_group("gloo", rank=RANK, world_size=WORLD)
    import megamoe.comm as mcomm
    import megamoe.ops as ops
    group = mcomm.group_name(None)
    local = a.experts // WORLD
    wt = Weights(a, RANK * local, (RANK + 1) * local)
    g = torch.Generator().manual_seed(a.seed + 7)
    gate = torch.randn(a.hidden, a.experts, generator=g) / a.hidden ** 0.5
    rows = []
    impls = a.impls.split(",")
    fns = {"megamoe": block_megamoe, "torch": block_torch, "torch_gloo": block_torch_gloo}
    for phase in a.phases.split(","):
        tokens = a.decode_tokens if phase == "decode" else a.prefill_tokens
        gx = torch.Generator().manual_seed(a.seed + 100 + RANK)
        x = torch.randn(tokens, a.hidden, generator=gx).to(BF)
        logits = x.float() @ gate
        outs = {}
        for impl in impls:
            out, t = timed(lambda: fns[impl](ops, a, wt, x, logits, group), a.iters, a.warmup)
            outs[impl] = out.float()
            rows.append({"block": a.block, "phase": phase, "impl": impl, "tokens": tokens,
                         "hidden": a.hidden, "intermediate": a.intermediate,
                         "experts": a.experts, "top_k": a.top_k, "ranks": WORLD,
                         "ms": t * 1e3})
        ref = outs.get("torch", outs.get("torch_gloo"))
        for r in rows:
            if r["phase"] == phase and ref is not None:
                o = outs[r["impl"]]
                err = float((o - ref).norm() / ref.norm())
                errs = [None] * WORLD
                dist.all_gather_object(errs, err)
                r["rel_l2_vs_torch"] = max(errs)
    if RANK == 0:
        text = "\n".join(json.dumps(r) for r in rows)
        if a.out:
            with open(a.out, "w") as f:
                f.write(text + "\n")
        else:
            print(text)
    ops.release()
    mcomm.shutdown()
    dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())
