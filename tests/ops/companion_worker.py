"""One rank of the companion-operator tests that need several ranks: runs under
`megamoe launch -n 2|4`.

usage: companion_worker.py OUT_PREFIX [CASE ...]
Cases: DispatchV2's pre-quantised x (x_dtype / scales_dtype) and A2's comm_alg "fullmesh", and
each real caller's whole MoE block (spec §14) written the way the caller writes it, with
torch_npu -> megamoe.ops, against a float64 model of the block (companion_ref.py) that knows
every expert. Every rank builds the same global inputs (seeded) and runs its own part.
Results go to OUT_PREFIX.<rank>.json as {case name: "ok" | error text}.
"""
import json
import os
import sys
import traceback

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from companion_ref import F64, close, rel_l2  # noqa: E402

import megamoe.comm as mcomm  # noqa: E402
import megamoe.ops as ops  # noqa: E402
from megamoe._ops_v1 import _expand_idx  # noqa: E402

RANK = int(os.environ.get("RANK", "0"))
WORLD = int(os.environ.get("WORLD_SIZE", "1"))
BF = torch.bfloat16
CASES = {}


def case(fn):
    CASES[fn.__name__] = fn
    return fn


def gen(seed):
    return torch.Generator().manual_seed(seed)


def bf(t):
    """Round to bf16 and back (the caller's tensors are bf16 there)."""
    return t.to(BF).to(F64)


def distinct_ids(g, n, k, e):
    return torch.stack([torch.randperm(e, generator=g)[:k] for _ in range(n)]).to(torch.int32)


class Experts:
    """E experts of a SwiGLU MLP in vLLM's layout: w13 [E, 2I, H] (gate rows first), w2
    [E, H, I]; the caller passes w13.transpose(1, 2) and w2.transpose(1, 2)."""

    def __init__(self, seed, e, h, i):
        g = gen(seed)
        self.e, self.h, self.i = e, h, i
        self.w13 = (torch.randn(e, 2 * i, h, generator=g) / h ** 0.5).to(BF)
        self.w2 = (torch.randn(e, h, i, generator=g) / i ** 0.5).to(BF)

    def mlp(self, x, e, w13=None, w2=None):
        """float64 model of one expert on bf16 rows, bf16 roundings where the block's tensors
        are bf16 (gmm1 output, swiglu output, gmm2 output)."""
        w13 = self.w13 if w13 is None else w13
        w2 = self.w2 if w2 is None else w2
        h = bf(x.to(F64) @ w13[e].to(F64).t())
        a, b = h.chunk(2, -1)
        act = bf(a * torch.sigmoid(a) * b)
        return bf(act @ w2[e].to(F64).t())

    def moe(self, x, ids, w):
        """sum_k w[t, k] * mlp_{ids[t, k]}(x[t])."""
        out = torch.zeros(x.shape[0], self.h, dtype=F64)
        for t in range(x.shape[0]):
            for k in range(ids.shape[1]):
                out[t] += float(w[t, k]) * self.mlp(x[t:t + 1], int(ids[t, k]))[0]
        return out


def ep():
    return mcomm.group_name(None)


# ---- DispatchV2: a pre-quantised x, and A2's comm_alg "fullmesh" -------------------------------

def _dispatch(x, ids, e, **kw):
    return ops.npu_moe_distribute_dispatch_v2(x, ids, ep(), WORLD, RANK, e, **kw)


@case
def dispatch_prequantised_x(bs=6, h=256, k=3, e_per=2):
    """An int8 x with per-token scales, fp8 bytes with per-group scales and with MX e8m0
    scales travel as they are: every output equals a dispatch of the same bytes carried as bf16
    (the scales appended to the row) with the rows' scales as expert_scales."""
    e = e_per * WORLD
    g = gen(11)
    ids = distinct_ids(g, bs * WORLD, k, e)[RANK * bs:(RANK + 1) * bs]
    ng, nmx = (h + 127) // 128, ((h + 31) // 32 + 1) // 2 * 2
    raw = torch.randint(-128, 128, (bs * WORLD, h), generator=g, dtype=torch.int8)[RANK * bs:][:bs]
    forms = [("int8", raw, torch.int8, torch.rand(bs, generator=g), None),
             ("fp8 group", raw.view(torch.uint8), ops.float8_e4m3fn,
              torch.rand(bs, ng, generator=g), None),
             ("fp8 mx", raw.view(torch.uint8), ops.float8_e5m2,
              torch.randint(100, 140, (bs, nmx), generator=g, dtype=torch.uint8), torch.uint8)]
    forms.append(("int8 hierarchy",) + forms[0][1:])
    for name, x, xdt, sc, sdt in forms:
        alg = "hierarchy" if "hierarchy" in name else ""
        got = _dispatch(x, ids, e, scales=sc, x_dtype=xdt, scales_dtype=sdt, comm_alg=alg)
        # the reference: row bytes + scale bytes, viewed as bf16 (even byte count), quant_mode 0
        sb = sc.contiguous().view(torch.uint8).reshape(bs, -1)
        packed = torch.cat([x.view(torch.uint8), sb], 1)
        if packed.shape[1] % 2:
            packed = torch.cat([packed, torch.zeros(bs, 1, dtype=torch.uint8)], 1)
        ref = _dispatch(packed.view(BF), ids, e)
        rows = ref[0].view(torch.uint8)
        n = int(ref[4][-1]) if ref[4].numel() else 0
        # the output keeps x's storage dtype; an fp8 x_dtype names it on torch >= 2.1
        want = xdt if isinstance(xdt, torch.dtype) else x.dtype
        assert got[0].dtype == want and got[0].shape == (ref[0].shape[0], h), \
            f"{name}: {got[0].dtype} {tuple(got[0].shape)}"
        assert torch.equal(got[0].view(torch.uint8)[:n], rows[:n, :h]), f"{name}: rows"
        assert bool((got[0].view(torch.uint8)[n:] == 0).all()), f"{name}: zero tail"
        gs = got[1].contiguous().view(torch.uint8).reshape(got[1].shape[0], -1)
        assert torch.equal(gs[:n], rows[:n, h:h + sb.shape[1]]), \
            f"{name}: scales {gs[:n]} vs {rows[:n, h:h + sb.shape[1]]}"
        for i in (2, 3, 4, 5):
            assert torch.equal(got[i], ref[i]), f"{name}: output {i}"
    # a quantised x with quant_mode 2 is refused, on every rank
    try:
        _dispatch(raw, ids, e, quant_mode=2, x_dtype=torch.int8)
    except ValueError as exc:
        assert "already quantised" in str(exc) or "rank" in str(exc), exc
    else:
        raise AssertionError("quant_mode 2 with an int8 x was accepted")


@case
def comm_alg_fullmesh_a2(bs=7, h=64, k=3, e_per=3):
    """comm_alg "fullmesh" (A2): the same rows, counts and combine as A3's fullmesh; the assist
    info holds A2's per-pair slot array (V1's expand_idx rule) ahead of the triples."""
    e = e_per * WORLD
    g = gen(12)
    x = torch.randn(bs * WORLD, h, generator=g).to(BF)[RANK * bs:(RANK + 1) * bs]
    ids = distinct_ids(g, bs * WORLD, k, e)[RANK * bs:(RANK + 1) * bs]
    w = torch.rand(bs * WORLD, k, generator=g)[RANK * bs:(RANK + 1) * bs]
    mask = torch.ones(bs, dtype=torch.bool)
    mask[bs - 2:] = False
    for quant in (0, 2):
        a3 = _dispatch(x, ids, e, quant_mode=quant, x_active_mask=mask)
        a2 = _dispatch(x, ids, e, quant_mode=quant, x_active_mask=mask, comm_alg="fullmesh")
        for i in (0, 1, 3, 4, 5):
            assert torch.equal(a2[i], a3[i]), f"quant {quant}: output {i}"
        slots = a2[2][:bs * k]
        assert torch.equal(slots, _expand_idx(ids, mask)), "A2 slot array"
        n3 = 3 * int(a3[4][-1])
        assert torch.equal(a2[2][bs * k:bs * k + n3], a3[2][:n3]), "triples after the slots"
        if quant == 0:
            y3 = ops.npu_moe_distribute_combine_v2(a3[0], ids, a3[2], a3[4], w, ep(), WORLD, RANK,
                                                   e, x_active_mask=mask)
            y2 = ops.npu_moe_distribute_combine_v2(a2[0], ids, a2[2], a2[4], w, ep(), WORLD,
                                                   RANK, e, x_active_mask=mask,
                                                   comm_alg="fullmesh")
            assert torch.equal(y2, y3), "combine"


# ---- the real callers' blocks (spec §14) --------------------------------------------------------

def _route(x_all, gate_w, k):
    """Router logits and the softmax top-k of vLLM-A's fused_topk_router (renormalised in Python
    because the operator does not renormalise softmax outputs)."""
    logits = x_all.float() @ gate_w
    w, ids, _ = ops.npu_moe_gating_top_k(logits, k=k, k_group=1, group_count=1,
                                         group_select_mode=1, renorm=0, norm_type=0,
                                         routed_scaling_factor=1.0, eps=1e-20)
    w = w / w.sum(-1, keepdim=True)
    return w, ids


@case
def block_vllm_ascend_main_mc2_bf16(bs=5, h=64, inter=32, k=3, e_per=2):
    e = e_per * WORLD
    ex = Experts(21, e, h, inter)
    g = gen(22)
    x_all = torch.randn(bs * WORLD, h, generator=g).to(BF)
    gate_w = torch.randn(h, e, generator=g)
    w_all, ids_all = _route(x_all, gate_w, k)
    sl = slice(RANK * bs, (RANK + 1) * bs)
    x, ids, w = x_all[sl], ids_all[sl], w_all[sl]
    local = slice(RANK * e_per, (RANK + 1) * e_per)
    w13t, w2t = ex.w13[local].transpose(1, 2), ex.w2[local].transpose(1, 2)  # vLLM's views
    (expand_x, _, assist, expert_token_nums, ep_recv_counts, tp_recv_counts,
     _) = ops.npu_moe_distribute_dispatch_v2(
        x=x, expert_ids=ids, group_ep=ep(), ep_world_size=WORLD, ep_rank_id=RANK,
        moe_expert_num=e, group_tp=ep(), tp_world_size=1, tp_rank_id=0, expert_shard_type=0,
        shared_expert_num=1, shared_expert_rank_num=0, quant_mode=0, global_bs=0,
        expert_token_nums_type=0)
    # unquant_apply_mlp
    hidden = ops.npu_grouped_matmul(x=[expand_x], weight=[w13t], split_item=2,
                                    group_list_type=0, group_type=0,
                                    group_list=expert_token_nums)[0]
    hidden = ops.npu_swiglu(hidden)
    hidden = ops.npu_grouped_matmul(x=[hidden], weight=[w2t], split_item=2, group_list_type=0,
                                    group_type=0, group_list=expert_token_nums)[0]
    out = ops.npu_moe_distribute_combine_v2(
        expand_x=hidden, expert_ids=ids, assist_info_for_combine=assist,
        ep_send_counts=ep_recv_counts, expert_scales=w.float(), group_ep=ep(),
        ep_world_size=WORLD, ep_rank_id=RANK, moe_expert_num=e, tp_send_counts=tp_recv_counts,
        group_tp=ep(), tp_world_size=1, tp_rank_id=0)
    close(out, ex.moe(x, ids, w), "vLLM-A MC2 bf16")


@case
def block_sglang_npu_init_routing_v2_finalize_routing_tp(n=6, h=64, inter=32, k=2, e=6):
    """sglang's torch_npu dispatcher with TP experts: every rank holds every expert with a
    1/WORLD slice of I; finalize_routing gives partial sums, an all-reduce adds them."""
    ex = Experts(31, e, h, inter * WORLD)
    g = gen(32)
    x = torch.randn(n, h, generator=g).to(BF)  # the same tokens on every TP rank
    logits = torch.randn(n, e, generator=g)
    topk_weights, topk_ids, _ = ops.npu_moe_gating_top_k(logits, k=k, norm_type=1,
                                                          routed_scaling_factor=1.0)
    i0, i1 = RANK * inter, (RANK + 1) * inter
    it = inter * WORLD
    w13 = torch.cat([ex.w13[:, i0:i1], ex.w13[:, it + i0:it + i1]], 1)  # this rank's slice
    w2 = ex.w2[:, :, i0:i1]
    expanded_x, expanded_row_idx, expert_tokens, _ = ops.npu_moe_init_routing_v2(
        x, topk_ids, active_num=n * k, expert_num=e, expert_tokens_num_type=1,
        expert_tokens_num_flag=True, active_expert_range=[0, e], quant_mode=-1)
    hs = ops.npu_grouped_matmul([expanded_x], [w13.transpose(1, 2)], group_list=expert_tokens,
                                split_item=3, group_type=0, group_list_type=1)[0]
    hs = ops.npu_swiglu(hs)
    hs = ops.npu_grouped_matmul([hs], [w2.transpose(1, 2)], group_list=expert_tokens,
                                split_item=3, group_type=0, group_list_type=1)[0]
    out = ops.npu_moe_finalize_routing(hs, skip1=None, skip2=None, bias=None,
                                       scales=topk_weights.to(torch.float32),
                                       expanded_src_to_dst_row=expanded_row_idx,
                                       export_for_source_row=topk_ids, drop_pad_mode=2)
    red = out.float()
    dist.all_reduce(red)
    ref = torch.zeros(n, h, dtype=F64)
    for t in range(n):
        for j in range(k):
            eid = int(topk_ids[t, j])
            part = torch.zeros(h, dtype=F64)
            for r in range(WORLD):  # the partial of every TP rank, each rounded to bf16
                a0, a1 = r * inter, (r + 1) * inter
                sw13 = torch.cat([ex.w13[:, a0:a1], ex.w13[:, it + a0:it + a1]], 1)
                part += ex.mlp(x[t:t + 1], eid, sw13, ex.w2[:, :, a0:a1])[0]
            ref[t] += float(topk_weights[t, j]) * part
    close(red, ref, "sglang TP")


@case
def block_vllm_ascend_main_allgather_ep_init_routing_v2_unpermute(bs=4, h=64, inter=32, k=3,
                                                                 e_per=2):
    """vLLM-A AllGather EP: gather every rank's tokens, route them all, keep the pairs of the
    local experts (init_routing_v2 with their range), unpermute with the |row index| and the
    weights of other ranks' experts zeroed, then reduce-scatter."""
    e = e_per * WORLD
    ex = Experts(41, e, h, inter)
    g = gen(42)
    x_all_ref = torch.randn(bs * WORLD, h, generator=g).to(BF)
    gate_w = torch.randn(h, e, generator=g)
    x = x_all_ref[RANK * bs:(RANK + 1) * bs]
    parts = [torch.empty(x.shape) for _ in range(WORLD)]
    dist.all_gather(parts, x.float())  # gloo has no bf16; the values are exact in fp32
    x_all = torch.cat(parts).to(BF)
    topk_weights, topk_ids = _route(x_all, gate_w, k)
    n = x_all.shape[0]
    lo, hi = RANK * e_per, (RANK + 1) * e_per
    expanded_x, expanded_row_idx, expert_tokens, _ = ops.npu_moe_init_routing_v2(
        x_all, topk_ids, scale=None, active_num=n * k, expert_num=e, expert_tokens_num_type=1,
        expert_tokens_num_flag=True, active_expert_range=[lo, hi], quant_mode=-1)
    hs = ops.npu_grouped_matmul(x=[expanded_x], weight=[ex.w13[lo:hi].transpose(1, 2)],
                                split_item=2, group_list_type=1, group_type=0,
                                group_list=expert_tokens)[0]
    hs = ops.npu_swiglu(hs)
    hs = ops.npu_grouped_matmul(x=[hs], weight=[ex.w2[lo:hi].transpose(1, 2)], split_item=2,
                                group_list_type=1, group_type=0, group_list=expert_tokens)[0]
    mask = (topk_ids >= lo) & (topk_ids < hi)
    probs = torch.where(mask, topk_weights, torch.zeros_like(topk_weights))
    out = ops.npu_moe_token_unpermute(permuted_tokens=hs,
                                      sorted_indices=torch.abs(expanded_row_idx),
                                      probs=probs, restore_shape=x_all.shape)
    red = out.float()
    dist.all_reduce(red)  # the reduce-scatter: every rank keeps its own tokens
    mine = red[RANK * bs:(RANK + 1) * bs]
    ref = ex.moe(x, topk_ids[RANK * bs:(RANK + 1) * bs], topk_weights[RANK * bs:(RANK + 1) * bs])
    close(mine, ref, "vLLM-A AllGather")


def _all_to_all(rows, send_counts):
    """torch.distributed all_to_all_single of rows [n, ...] by per-rank counts."""
    sc = torch.tensor(send_counts, dtype=torch.int64)
    rc = torch.empty_like(sc)
    dist.all_to_all_single(rc, sc)
    out = torch.empty((int(rc.sum()), *rows.shape[1:]), dtype=rows.dtype)
    if rows.dtype == BF:  # gloo has no bf16: move the bits, two per int32
        dist.all_to_all_single(out.view(torch.int32), rows.contiguous().view(torch.int32),
                               rc.tolist(), sc.tolist())
    else:
        dist.all_to_all_single(out, rows.contiguous(), rc.tolist(), sc.tolist())
    return out, rc.tolist()


@case
def block_vllm_ascend_main_alltoallv_bf16_token_permute(bs=5, h=64, inter=32, k=3, e_per=2):
    """vLLM-A All2AllV: permute by global expert, exchange per destination rank, permute again by
    local expert (1-D ids), experts, unpermute, exchange back, unpermute with the weights."""
    e = e_per * WORLD
    ex = Experts(51, e, h, inter)
    g = gen(52)
    x_all = torch.randn(bs * WORLD, h, generator=g).to(BF)
    gate_w = torch.randn(h, e, generator=g)
    w_all, ids_all = _route(x_all, gate_w, k)
    sl = slice(RANK * bs, (RANK + 1) * bs)
    hidden_states, topk_ids, topk_weights = x_all[sl], ids_all[sl], w_all[sl]
    num_local_tokens_per_expert = torch.bincount(topk_ids.reshape(-1).long(), minlength=e)
    permutated_local_input_tokens, reversed_local_input_permutation_mapping = \
        ops.npu_moe_token_permute(tokens=hidden_states, indices=topk_ids,
                                  num_out_tokens=topk_ids.numel())
    send = num_local_tokens_per_expert.reshape(WORLD, e_per).sum(1).tolist()
    global_input_tokens, recv = _all_to_all(permutated_local_input_tokens, send)
    # counts per (source, local expert), exchanged like vLLM's num_global_tokens_per_expert
    cnt_all = [torch.empty(e, dtype=torch.int64) for _ in range(WORLD)]
    dist.all_gather(cnt_all, num_local_tokens_per_expert)
    per_src = torch.stack(cnt_all)[:, RANK * e_per:(RANK + 1) * e_per]  # [WORLD, e_per]
    local_ids = torch.repeat_interleave(torch.arange(e_per).repeat(WORLD), per_src.reshape(-1))
    global_input_tokens, reversed_global_input_permutation_mapping = ops.npu_moe_token_permute(
        global_input_tokens, local_ids.to(torch.int32))
    group_list = per_src.sum(0)
    lo, hi = RANK * e_per, (RANK + 1) * e_per
    hs = ops.npu_grouped_matmul(x=[global_input_tokens], weight=[ex.w13[lo:hi].transpose(1, 2)],
                                split_item=2, group_list_type=1, group_type=0,
                                group_list=group_list)[0]
    hs = ops.npu_swiglu(hs)
    hs = ops.npu_grouped_matmul(x=[hs], weight=[ex.w2[lo:hi].transpose(1, 2)], split_item=2,
                                group_list_type=1, group_type=0, group_list=group_list)[0]
    hs = ops.npu_moe_token_unpermute(hs, reversed_global_input_permutation_mapping)
    back, _ = _all_to_all(hs, recv)
    out = ops.npu_moe_token_unpermute(permuted_tokens=back,
                                      sorted_indices=reversed_local_input_permutation_mapping,
                                      probs=topk_weights, restore_shape=hidden_states.shape)
    close(out, ex.moe(hidden_states, topk_ids, topk_weights), "vLLM-A All2AllV bf16")


@case
def block_hyper_parallel_route_permute_unpermute_autograd(t=64, h=64, inter=32, k=2, e_per=2):
    """HyperParallel route.py (training): permute with npu_moe_token_permute, the experts on the
    permuted rows (MegaMoeExperts, one row per pair), unpermute with fp32 router weights;
    backward gives d hidden, d router weights and d W, checked against float64 autograd."""
    from megamoe import MegaMoeExperts
    e = e_per * WORLD
    ex = Experts(61, e, h, inter)
    g = gen(62)
    x_all = torch.randn(t * WORLD, h, generator=g).to(BF)
    gate_w = torch.randn(h, e, generator=g)
    w_all, ids_all = _route(x_all, gate_w, k)
    sl = slice(RANK * t, (RANK + 1) * t)
    hidden = x_all[sl].clone().requires_grad_()
    topk_ids, probs = ids_all[sl], w_all[sl].float().clone().requires_grad_()
    layer = MegaMoeExperts(t * k, h, inter, e, 1, ep_size=WORLD, create_parameters=False)
    lo, hi = RANK * e_per, (RANK + 1) * e_per
    gate_up = ex.w13[lo:hi].transpose(1, 2).contiguous().requires_grad_()  # [L, H, 2I]
    down = ex.w2[lo:hi].transpose(1, 2).contiguous().requires_grad_()      # [L, I, H]
    try:
        routed, mapping = ops.npu_moe_token_permute(hidden, topk_ids)
        mapping = mapping.reshape(-1).to(torch.int32).contiguous()
        sorted_ids = torch.sort(topk_ids.reshape(-1).long(), stable=True).values
        expert_out = layer(routed, sorted_ids.reshape(-1, 1).to(torch.int32),
                           torch.ones(t * k, 1), expert_weights=(gate_up, down))
        out = ops.npu_moe_token_unpermute(expert_out, mapping, probs=probs.float().contiguous())
        grad = torch.randn(t, h, generator=gen(63 + RANK)).to(BF)
        out.backward(grad)
    finally:
        layer.close()
    # float64 model with autograd over every expert (the local slice of dW is compared)
    xr = x_all[sl].to(F64).requires_grad_()
    pr = w_all[sl].to(F64).requires_grad_()
    w13r = ex.w13.to(F64).requires_grad_()
    w2r = ex.w2.to(F64).requires_grad_()
    ref = torch.zeros(t, h, dtype=F64)
    rows = []
    for tt in range(t):
        acc = torch.zeros(h, dtype=F64)
        for j in range(k):
            eid = int(topk_ids[tt, j])
            hh = xr[tt] @ w13r[eid].t()
            a, b = hh.chunk(2)
            acc = acc + pr[tt, j] * ((a * torch.sigmoid(a) * b) @ w2r[eid].t())
        rows.append(acc)
    ref = torch.stack(rows)
    # every rank's loss term: the dW of this rank's experts sums all ranks' tokens
    (ref * grad.to(F64)).sum().backward()
    assert rel_l2(out.detach(), ref.detach()) < 0.02, f"out rel-L2 {rel_l2(out.detach(), ref)}"
    assert rel_l2(hidden.grad, xr.grad) < 0.02, f"d hidden rel-L2 {rel_l2(hidden.grad, xr.grad)}"
    assert rel_l2(probs.grad, pr.grad) < 0.02, f"d probs rel-L2 {rel_l2(probs.grad, pr.grad)}"
    # dW: the local experts see every rank's pairs: reduce the model's contributions
    dw13 = w13r.grad.clone()
    dw2 = w2r.grad.clone()
    dist.all_reduce(dw13)
    dist.all_reduce(dw2)
    d_gate_up = dw13[lo:hi].transpose(1, 2)
    d_down = dw2[lo:hi].transpose(1, 2)
    assert rel_l2(gate_up.grad, d_gate_up) < 0.02, f"d gate_up {rel_l2(gate_up.grad, d_gate_up)}"
    assert rel_l2(down.grad, d_down) < 0.02, f"d down {rel_l2(down.grad, d_down)}"


# ---- W8A8 blocks ---------------------------------------------------------------------------------

class QExperts:
    """int8 experts in vLLM-Ascend's W8A8 layout: w13 [E, H, 2I] int8 with fp32 scales [E, 2I],
    w2 [E, I, H] int8 with bf16 scales [E, H] (the output dtype); optional smoothing scales
    folded into the weights (SmoothQuant: the activations are multiplied, the weights divided).
    model(): float64 of the block on the dequantised weights and unquantised activations."""

    def __init__(self, seed, e, h, i, smooth=False):
        g = gen(seed)
        self.e, self.h, self.i = e, h, i
        w13 = torch.randn(e, h, 2 * i, generator=g) / h ** 0.5
        w2 = torch.randn(e, i, h, generator=g) / i ** 0.5
        self.s1 = torch.rand(e, h, generator=g) + 0.5 if smooth else None  # per expert
        self.s2 = torch.rand(e, i, generator=g) + 0.5 if smooth else None
        if smooth:
            w13 = w13 / self.s1.unsqueeze(2)
            w2 = w2 / self.s2.unsqueeze(2)
        self.w13, self.w13_s, self.w13_deq = self._q(w13)
        self.w2, s2, self.w2_deq = self._q(w2)
        self.w2_s = s2.to(BF)
        self.w2_deq = self.w2.double() * self.w2_s.double().unsqueeze(1)

    @staticmethod
    def _q(w):
        s = w.abs().amax(1) / 127.0
        q = torch.round(w / s.unsqueeze(1)).clamp(-127, 127).to(torch.int8)
        return q, s, q.double() * s.double().unsqueeze(1)

    def mlp(self, x, e):
        v = x.double()
        if self.s1 is not None:
            v = v * self.s1[e].double()
        hh = v @ self.w13_deq[e]
        a, b = hh.chunk(2, -1)
        act = a * torch.sigmoid(a) * b
        if self.s2 is not None:
            act = act * self.s2[e].double()
        return act @ self.w2_deq[e]

    def moe(self, x, ids, w):
        out = torch.zeros(x.shape[0], self.h, dtype=F64)
        for t in range(x.shape[0]):
            for k in range(ids.shape[1]):
                out[t] += float(w[t, k]) * self.mlp(x[t:t + 1], int(ids[t, k]))[0]
        return out


def _w8a8_mc2(fused, comm_alg, bs=6, h=128, inter=64, k=3, e_per=2):
    """vLLM-Ascend v0.13 MC2 W8A8 (quant_apply_mlp's MC2 branch), A2 form (comm_alg
    "fullmesh"): dispatch quant_mode 2 -> int32 gmm -> dequant_swiglu_quant (cumsum -> counts)
    -> scaled gmm, or the fused npu_grouped_matmul_swiglu_quant; -> combine_v2."""
    e = e_per * WORLD
    ex = QExperts(71, e, h, inter)
    g = gen(72)
    x_all = torch.randn(bs * WORLD, h, generator=g).to(BF)
    gate_w = torch.randn(h, e, generator=g)
    w_all, ids_all = _route(x_all, gate_w, k)
    sl = slice(RANK * bs, (RANK + 1) * bs)
    x, ids, w = x_all[sl], ids_all[sl], w_all[sl]
    lo, hi = RANK * e_per, (RANK + 1) * e_per
    w1, w1_scale = [ex.w13[lo:hi]], [ex.w13_s[lo:hi]]
    w2, w2_scale = [ex.w2[lo:hi]], [ex.w2_s[lo:hi]]
    (hidden_states, pertoken_scale, assist, group_list, ep_recv_counts, tp_recv_counts,
     _) = ops.npu_moe_distribute_dispatch_v2(
        x=x, expert_ids=ids, group_ep=ep(), ep_world_size=WORLD, ep_rank_id=RANK,
        moe_expert_num=e, quant_mode=2, global_bs=0, expert_token_nums_type=0,
        comm_alg=comm_alg)
    group_list_type = 0
    if fused:
        hidden_states, swiglu_out_scale, _ = ops.npu_grouped_matmul_swiglu_quant(
            x=hidden_states, weight=w1[0], group_list=group_list, weight_scale=w1_scale[0],
            x_scale=pertoken_scale)
    else:
        hidden_states = ops.npu_grouped_matmul(x=[hidden_states], weight=w1, split_item=3,
                                               group_list_type=group_list_type, group_type=0,
                                               group_list=group_list, output_dtype=torch.int32)[0]
        counts = torch.cat([group_list[:1], torch.diff(group_list, dim=0)])  # cumsum -> counts
        hidden_states, swiglu_out_scale = ops.npu_dequant_swiglu_quant(
            x=hidden_states, weight_scale=w1_scale[0], activation_scale=pertoken_scale,
            bias=None, quant_scale=None, quant_offset=None, group_index=counts,
            activate_left=True, quant_mode=1)
    hidden_states = ops.npu_grouped_matmul(x=[hidden_states], weight=w2, scale=w2_scale,
                                           per_token_scale=[swiglu_out_scale], split_item=2,
                                           group_list_type=group_list_type, group_type=0,
                                           group_list=group_list,
                                           output_dtype=w2_scale[0].dtype)[0]
    out = ops.npu_moe_distribute_combine_v2(
        expand_x=hidden_states, expert_ids=ids, assist_info_for_combine=assist,
        ep_send_counts=ep_recv_counts, expert_scales=w.float(), group_ep=ep(),
        ep_world_size=WORLD, ep_rank_id=RANK, moe_expert_num=e, comm_alg=comm_alg)
    err = rel_l2(out, ex.moe(x, ids, w))
    assert err < 0.03, f"rel-L2 {err:.4f} against the float64 block"


@case
def block_vllm_ascend_v013_mc2_w8a8_dequant_swiglu_quant():
    _w8a8_mc2(False, "fullmesh")


@case
def block_vllm_ascend_v013_mc2_w8a8_fused_gmm_swiglu_quant():
    _w8a8_mc2(True, "")


@case
def block_cann_recipes_deepseek_r1_mc2_w8a8_smooth(bs=5, h=128, inter=64, k=4, e_per=8):
    """cann-recipes DeepSeek-R1 decode: grouped sigmoid gating with a correction bias and x2.5,
    dispatch quant_mode 2 with per-expert smoothing scales (fullmesh_v2), int32 gmm,
    dequant_swiglu_quant with the second smoothing scales and per-expert counts, the scaled
    gmm, combine_v2 with the shared expert's output."""
    e = e_per * WORLD
    ex = QExperts(81, e, h, inter, smooth=True)
    sh = Experts(82, 1, h, inter)  # the shared expert (bf16)
    g = gen(83)
    x_all = torch.randn(bs * WORLD, h, generator=g).to(BF)
    gate_w = torch.randn(h, e, generator=g)
    e_bias = torch.randn(e, generator=g) * 0.1
    sl = slice(RANK * bs, (RANK + 1) * bs)
    x = x_all[sl]
    topk_weight, topk_idx, _ = ops.npu_moe_gating_top_k(
        x.float() @ gate_w, k=k, bias=e_bias, k_group=2, group_count=4, group_select_mode=1,
        renorm=0, norm_type=1, routed_scaling_factor=2.5, eps=1e-20)
    lo, hi = RANK * e_per, (RANK + 1) * e_per
    expand_x, dynamic_scale, assist, expert_tokens, ep_recv_counts, tp_recv_counts, _ = \
        ops.npu_moe_distribute_dispatch_v2(
            x=x, expert_ids=topk_idx, group_ep=ep(), ep_world_size=WORLD, ep_rank_id=RANK,
            moe_expert_num=e, scales=ex.s1, quant_mode=2, expert_token_nums_type=1,
            comm_alg="fullmesh_v2")
    hs = ops.npu_grouped_matmul([expand_x], [ex.w13[lo:hi]], group_list=expert_tokens,
                                split_item=3, group_type=0, group_list_type=1,
                                output_dtype=torch.int32, tuning_config=[0])[0]
    hs, pertoken = ops.npu_dequant_swiglu_quant(
        hs, weight_scale=ex.w13_s[lo:hi], activation_scale=dynamic_scale,
        quant_scale=ex.s2[lo:hi], group_index=expert_tokens, activate_left=True, quant_mode=1)
    hs = ops.npu_grouped_matmul([hs], [ex.w2[lo:hi]], scale=[ex.w2_s[lo:hi]],
                                per_token_scale=[pertoken], group_list=expert_tokens,
                                split_item=3, group_type=0, group_list_type=1,
                                output_dtype=torch.bfloat16, tuning_config=[0])[0]
    # the shared expert (dense, bf16) on every token of this rank
    shared = torch.nn.functional.linear(ops.npu_swiglu(
        torch.nn.functional.linear(x, sh.w13[0])), sh.w2[0])
    out = ops.npu_moe_distribute_combine_v2(
        expand_x=hs, expert_ids=topk_idx, assist_info_for_combine=assist,
        ep_send_counts=ep_recv_counts, expert_scales=topk_weight.float(), group_ep=ep(),
        ep_world_size=WORLD, ep_rank_id=RANK, moe_expert_num=e, shared_expert_x=shared,
        comm_alg="fullmesh_v2")
    ref = ex.moe(x, topk_idx, topk_weight) + sh.mlp(x, 0)
    err = rel_l2(out, ref)
    assert err < 0.03, f"rel-L2 {err:.4f} against the float64 block"


@case
def block_vllm_ascend_main_alltoallv_w8a8_dynamic_quant_init_routing_v2(bs=5, h=128, inter=64,
                                                                        k=3, e_per=2):
    """vLLM-A All2AllV W8A8: permute, dynamic_quant, exchange rows and scales, init_routing_v2
    of the int8 rows with their scales (local expert ids, x_dtype int8), scaled gmm, swiglu,
    dynamic_quant, scaled gmm, unpermute, exchange back, unpermute with the weights."""
    e = e_per * WORLD
    ex = QExperts(91, e, h, inter)
    g = gen(92)
    x_all = torch.randn(bs * WORLD, h, generator=g).to(BF)
    gate_w = torch.randn(h, e, generator=g)
    w_all, ids_all = _route(x_all, gate_w, k)
    sl = slice(RANK * bs, (RANK + 1) * bs)
    hidden_states, topk_ids, topk_weights = x_all[sl], ids_all[sl], w_all[sl]
    num_local_tokens_per_expert = torch.bincount(topk_ids.reshape(-1).long(), minlength=e)
    permutated, reversed_local = ops.npu_moe_token_permute(tokens=hidden_states, indices=topk_ids,
                                                          num_out_tokens=topk_ids.numel())
    permutated, dynamic_scale = ops.npu_dynamic_quant(permutated)
    send = num_local_tokens_per_expert.reshape(WORLD, e_per).sum(1).tolist()
    global_input_tokens, recv = _all_to_all(permutated, send)
    global_scales, _ = _all_to_all(dynamic_scale.reshape(-1, 1), send)
    cnt_all = [torch.empty(e, dtype=torch.int64) for _ in range(WORLD)]
    dist.all_gather(cnt_all, num_local_tokens_per_expert)
    per_src = torch.stack(cnt_all)[:, RANK * e_per:(RANK + 1) * e_per]
    local_ids = torch.repeat_interleave(torch.arange(e_per).repeat(WORLD), per_src.reshape(-1))
    expanded_x, expanded_row_idx, expert_tokens, expanded_scale = ops.npu_moe_init_routing_v2(
        global_input_tokens, local_ids.to(torch.int32).unsqueeze(-1),
        scale=global_scales.reshape(-1), expert_num=e, expert_tokens_num_flag=True,
        active_expert_range=[0, e_per], x_dtype=torch.int8)
    lo, hi = RANK * e_per, (RANK + 1) * e_per
    hs = ops.npu_grouped_matmul(x=[expanded_x], weight=[ex.w13[lo:hi]],
                                scale=[ex.w13_s[lo:hi].to(BF)], per_token_scale=[expanded_scale],
                                split_item=2, group_list_type=0, group_type=0,
                                group_list=expert_tokens, output_dtype=BF)[0]
    hs = ops.npu_swiglu(hs)
    hs, swiglu_scale = ops.npu_dynamic_quant(hs)
    hs = ops.npu_grouped_matmul(x=[hs], weight=[ex.w2[lo:hi]], scale=[ex.w2_s[lo:hi]],
                                per_token_scale=[swiglu_scale], split_item=2, group_list_type=0,
                                group_type=0, group_list=expert_tokens, output_dtype=BF)[0]
    hs = ops.npu_moe_token_unpermute(hs, expanded_row_idx)
    back, _ = _all_to_all(hs, recv)
    out = ops.npu_moe_token_unpermute(permuted_tokens=back, sorted_indices=reversed_local,
                                      probs=topk_weights, restore_shape=hidden_states.shape)
    err = rel_l2(out, ex.moe(hidden_states, topk_ids, topk_weights))
    assert err < 0.03, f"rel-L2 {err:.4f} against the float64 block"


def main():
    out = sys.argv[1]
    names = sys.argv[2:] or list(CASES)
    dist.init_process_group("gloo", rank=RANK, world_size=WORLD)
    results = {}
    for name in names:
        try:
            CASES[name]()
            results[name] = "ok"
        except Exception:  # noqa: BLE001 - every failure is reported per case
            results[name] = traceback.format_exc()
            if "TIMEOUT" in results[name] or "PEER_LOST" in results[name]:
                break
    with open(f"{out}.{RANK}.json", "w") as f:
        json.dump(results, f)
    ops.release()
    mcomm.shutdown()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
