"""torch_npu's V1 operators, npu_moe_distribute_dispatch / npu_moe_distribute_combine, as a thin
mapping onto the V2 implementation (megamoe.ops; docs/ops.md "V1 operators").

Same signatures, defaults and 7-tuple as torch_npu. What differs from V2 is the third output:
V1's ``expand_idx`` is [BS * K] int32 on the SOURCE side, entry t * K + k = the number of earlier
pairs (flat order t * K + k) this rank routed to the same expert, i.e. the row's place in its
(source, expert) block (A3 kernel MoeDistributeDispatch: the count of equal ids before it); V2's
``assist_info_for_combine`` holds (source, token, slot) triples on the EXPERT side. The V1
dispatch runs the V2 dispatch, computes ``expand_idx`` from ``expert_ids`` (and the mask) and
attaches the V2 triples to that tensor; the V1 combine runs the V2 combine with them. A copy of
``expand_idx`` loses the attachment: the combine then rebuilds the triples with one
metadata-only V2 dispatch (H = 1) of the same ``expert_ids`` / mask / attributes, so the result
is the same, one exchange later (every rank must take the same path: a rank passing a copy
while another passes the original gets CALL_MISMATCH on both, nothing hangs).

Both are torch.ops.megamoe operators (megamoe/_library.py) whose bodies call the V2 bodies; under
torch.compile the attachment survives when the graph hands the dispatch's tensor to the combine,
and the combine rebuilds the triples otherwise (the same result on every rank).
"""
import torch

from . import ops as _v2
from ._library import FAKE_BY_BODY, faking
from ._library import megamoe as _megamoe

_SCHEMA_DISPATCH = (
    "npu_moe_distribute_dispatch(Tensor? x, Tensor? expert_ids, str group_ep, "
    "int ep_world_size, int ep_rank_id, int moe_expert_num, *, Tensor? scales=None, "
    "Tensor? x_active_mask=None, Tensor? expert_scales=None, str group_tp=\"\", "
    "int tp_world_size=0, int tp_rank_id=0, int expert_shard_type=0, int shared_expert_num=1, "
    "int shared_expert_rank_num=0, int quant_mode=0, int global_bs=0, "
    "int expert_token_nums_type=1) -> (Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor)")
_SCHEMA_COMBINE = (
    "npu_moe_distribute_combine(Tensor? expand_x, Tensor? expert_ids, Tensor? expand_idx, "
    "Tensor? ep_send_counts, Tensor? expert_scales, str group_ep, int ep_world_size, "
    "int ep_rank_id, int moe_expert_num, *, Tensor? tp_send_counts=None, "
    "Tensor? x_active_mask=None, Tensor? activation_scale=None, Tensor? weight_scale=None, "
    "Tensor? group_list=None, Tensor? expand_scales=None, Tensor? shared_expert_x=None, "
    "str group_tp=\"\", int tp_world_size=0, int tp_rank_id=0, int expert_shard_type=0, "
    "int shared_expert_num=1, int shared_expert_rank_num=0, int global_bs=0, int out_dtype=0, "
    "int comm_quant_mode=0, int group_list_type=0) -> Tensor")
_NORMALIZE = {"group_ep": _v2._group_name, "group_tp": _v2._group_name}


def _expand_idx(expert_ids, x_active_mask):
    """V1 expand_idx [BS * K] int32: per pair, the number of earlier routed pairs with the same
    expert id. Pairs x_active_mask excludes are not routed and hold 0."""
    ids = expert_ids.reshape(-1).to(torch.int64)
    n = ids.numel()
    routed = torch.ones(n, dtype=torch.bool, device="cpu")
    if x_active_mask is not None:
        m = x_active_mask.to(torch.bool)
        k = expert_ids.shape[1] if expert_ids.dim() == 2 else 1
        routed = (m.reshape(-1, 1).expand(-1, k) if m.dim() == 1 else m).reshape(-1)
    key = torch.where(routed, ids, torch.full_like(ids, -1))  # not routed: one group of their own
    order = torch.sort(key, stable=True).indices
    sk = key[order]
    pos = torch.arange(n, dtype=torch.int64, device="cpu") - torch.searchsorted(sk, sk)  # place in the group
    out = torch.empty(n, dtype=torch.int64, device="cpu")
    out[order] = pos
    out[~routed] = 0
    return out.to(torch.int32)


@_megamoe.define(_SCHEMA_DISPATCH, fake=FAKE_BY_BODY, collective=True, normalize=_NORMALIZE)
def npu_moe_distribute_dispatch(x, expert_ids, group_ep, ep_world_size, ep_rank_id,
                                moe_expert_num, *, scales=None, x_active_mask=None,
                                expert_scales=None, group_tp="", tp_world_size=0, tp_rank_id=0,
                                expert_shard_type=0, shared_expert_num=1,
                                shared_expert_rank_num=0, quant_mode=0, global_bs=0,
                                expert_token_nums_type=1):
    """Returns (expand_x, dynamic_scales, expand_idx, expert_token_nums, ep_recv_counts,
    tp_recv_counts, expand_scales): V2's outputs with V1's expand_idx in third place."""
    outs = _v2.npu_moe_distribute_dispatch_v2.body(
        x, expert_ids, group_ep, ep_world_size, ep_rank_id, moe_expert_num, scales=scales,
        x_active_mask=x_active_mask, expert_scales=expert_scales, group_tp=group_tp,
        tp_world_size=tp_world_size, tp_rank_id=tp_rank_id, expert_shard_type=expert_shard_type,
        shared_expert_num=shared_expert_num, shared_expert_rank_num=shared_expert_rank_num,
        quant_mode=quant_mode, global_bs=global_bs, expert_token_nums_type=expert_token_nums_type)
    if faking():
        n = expert_ids.numel() if isinstance(expert_ids, torch.Tensor) else 0
        expand_idx = torch.empty(n, dtype=torch.int32, device=outs[0].device)
    else:
        expand_idx = _expand_idx(expert_ids, x_active_mask)
        setattr(expand_idx, _v2._V2_ASSIST, outs[2])
    return (outs[0], outs[1], expand_idx) + tuple(outs[3:])


def _rebuild_assist(kw):
    """V2 triples of this routing from a metadata-only V2 dispatch (H = 1, no quantisation)."""
    dtype = kw["expand_x"].dtype if isinstance(kw["expand_x"], torch.Tensor) else torch.bfloat16
    if dtype not in (torch.bfloat16, torch.float16):
        dtype = torch.bfloat16  # the combine names a bad expand_x dtype itself
    ids = kw["expert_ids"]
    bs = ids.shape[0] if isinstance(ids, torch.Tensor) and ids.dim() >= 1 else 0
    outs = _v2.npu_moe_distribute_dispatch_v2.body(
        torch.zeros(bs, 1, dtype=dtype, device="cpu"), ids, kw["group_ep"], kw["ep_world_size"],
        kw["ep_rank_id"], kw["moe_expert_num"], x_active_mask=kw["x_active_mask"],
        group_tp=kw["group_tp"], tp_world_size=kw["tp_world_size"], tp_rank_id=kw["tp_rank_id"],
        expert_shard_type=kw["expert_shard_type"], shared_expert_num=kw["shared_expert_num"],
        shared_expert_rank_num=kw["shared_expert_rank_num"], global_bs=kw["global_bs"])
    return outs[2]


@_megamoe.define(_SCHEMA_COMBINE, fake=FAKE_BY_BODY, collective=True, normalize=_NORMALIZE)
def npu_moe_distribute_combine(expand_x, expert_ids, expand_idx, ep_send_counts, expert_scales,
                               group_ep, ep_world_size, ep_rank_id, moe_expert_num, *,
                               tp_send_counts=None, x_active_mask=None, activation_scale=None,
                               weight_scale=None, group_list=None, expand_scales=None,
                               shared_expert_x=None, group_tp="", tp_world_size=0, tp_rank_id=0,
                               expert_shard_type=0, shared_expert_num=1, shared_expert_rank_num=0,
                               global_bs=0, out_dtype=0, comm_quant_mode=0, group_list_type=0):
    """Returns x [BS, H] (dtype of expand_x): the V2 combine of the dispatch expand_idx came from."""
    kw = dict(locals())
    assist = _v2._v2_assist(expand_idx)
    kw["assist_info_for_combine"] = assist if assist is not expand_idx else _rebuild_assist(kw)
    if any(kw[n] is not None for n in _RESERVED_TENSORS) or kw["out_dtype"] or kw["group_list_type"]:
        return _v2._combine(kw)  # reserved inputs: the library rejects them on every rank
    return _v2.npu_moe_distribute_combine_v2.body(
        *[kw[n] for n in ("expand_x", "expert_ids", "assist_info_for_combine", "ep_send_counts",
                          "expert_scales", "group_ep", "ep_world_size", "ep_rank_id",
                          "moe_expert_num")],
        **{n: kw[n] for n in ("tp_send_counts", "x_active_mask", "expand_scales",
                              "shared_expert_x", "group_tp", "tp_world_size", "tp_rank_id",
                              "expert_shard_type", "shared_expert_num", "shared_expert_rank_num",
                              "global_bs", "comm_quant_mode")})


_RESERVED_TENSORS = ("activation_scale", "weight_scale", "group_list")
