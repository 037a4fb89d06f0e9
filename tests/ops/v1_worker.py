"""One rank of the V1 operator tests (npu_moe_distribute_dispatch / _combine): runs under
`megamoe launch -n 2|4`.

usage: v1_worker.py OUT_PREFIX
Each case calls the V1 operators with the keyword arguments and output unpacking of one real
caller (vllm-ascend's MC2 dispatcher on A3 and A2, sglang's Ascend DeepEP dispatcher, omni-infer
with V2 off) and checks, bit for bit: every dispatch output against the numpy model (v2_ref.py)
and against the V2 operator on the same inputs, expand_idx against the model's V1 rule, the
combine against the model and the V2 combine, the combine with a COPY of expand_idx (the
metadata path) and combine_add_rms_norm fed with the V1 expand_idx. Then ranks that disagree
about the path (one copy, one original) both get CALL_MISMATCH and the next call works.
Results go to OUT_PREFIX.<rank>.json as {case name: "ok" | error text}.
"""
import json
import os
import sys
import traceback

import numpy as np
import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import v2_ref as R  # noqa: E402
from v1_cases import CASES  # noqa: E402
from v2_worker import (RANK, WORLD, bits_tensor, expert_outputs, groups, make_inputs,  # noqa: E402
                       same, tensor_bits)

import megamoe.comm as mcomm  # noqa: E402
import megamoe.ops as ops  # noqa: E402
from megamoe.errors import MegaMoeError  # noqa: E402


def _bits_equal(name, got, want_tensor):
    same(name, got, tensor_bits(want_tensor))


def _dispatch_kwargs(case, style, me, group_ep, group_tp):
    """The callers' dispatch keyword arguments, as they build them."""
    cfg = R.Cfg(case)
    T = cfg.T
    e, p = RANK // T, RANK % T
    x = bits_tensor(me["x"], cfg.xt)
    ids = torch.from_numpy(me["ids"])
    mask = torch.from_numpy(np.asarray(me["mask"])) if me["mask"] is not None else None
    if style in ("vllm_a3", "vllm_a2"):
        kw = {"x": x, "expert_ids": ids, "expert_shard_type": 0, "shared_expert_rank_num": 0,
              "moe_expert_num": cfg.E, "global_bs": cfg.gbs, "expert_token_nums_type": cfg.ent}
        if cfg.gbs == 0:
            kw["x_active_mask"] = mask
        kw.update({"scales": None, "quant_mode": cfg.quant, "group_ep": group_ep,
                   "ep_world_size": cfg.W, "ep_rank_id": e})
        if style == "vllm_a3":  # need_extra_args: the EP group's name as group_tp, no TP
            kw.update({"group_tp": group_ep, "tp_world_size": 1, "tp_rank_id": 0})
        if me["ws"] is not None:  # hierarchical communication: expert_scales to dispatch
            kw["expert_scales"] = torch.from_numpy(me["ws"])
        return kw
    if style == "sglang":
        return {"x": x, "expert_ids": ids.to(torch.int32), "expert_shard_type": 0,
                "shared_expert_rank_num": 0, "moe_expert_num": cfg.E, "global_bs": cfg.gbs,
                "scales": None, "quant_mode": cfg.quant, "group_ep": group_ep,
                "ep_world_size": cfg.W, "ep_rank_id": e, "group_tp": group_ep,
                "tp_world_size": 1, "tp_rank_id": 0}
    if style == "omni":
        return {"x": x, "expert_ids": ids, "expert_shard_type": 0,
                "shared_expert_rank_num": cfg.S, "moe_expert_num": cfg.E, "global_bs": cfg.gbs,
                "scales": None, "quant_mode": cfg.quant, "group_ep": group_ep,
                "ep_world_size": cfg.W, "ep_rank_id": e,
                "group_tp": group_tp if cfg.tp == 2 else group_ep,
                "tp_world_size": cfg.tp, "tp_rank_id": p, "x_active_mask": mask}
    return {"x": x, "expert_ids": ids, "group_ep": group_ep, "ep_world_size": cfg.W,
            "ep_rank_id": e, "moe_expert_num": cfg.E}  # positional


def _dispatch_v1(style, kw):
    if style == "positional":
        return ops.npu_moe_distribute_dispatch(kw["x"], kw["expert_ids"], kw["group_ep"],
                                               kw["ep_world_size"], kw["ep_rank_id"],
                                               kw["moe_expert_num"])
    return ops.npu_moe_distribute_dispatch(**kw)


def _unpack(style, output):
    """Each caller's unpacking; returns the seven in V1 order (None where it drops one)."""
    if style in ("vllm_a3", "vllm_a2", "positional"):
        expand_x, dynamic_scale, expand_idx, expert_token_nums, ep_recv_counts, tp_recv_counts, \
            expand_scales = output[0:7]
        return [expand_x, dynamic_scale, expand_idx, expert_token_nums, ep_recv_counts,
                tp_recv_counts, expand_scales]
    if style == "sglang":
        expand_x, dynamic_scale, expand_idx, expert_token_nums, ep_recv_counts, \
            tp_recv_counts = output[0:6]
        return [expand_x, dynamic_scale, expand_idx, expert_token_nums, ep_recv_counts,
                tp_recv_counts, None]
    expand_x, dynamic_scale, expand_idx, expert_token_nums, ep_recv_counts = output[0:5]
    return [expand_x, dynamic_scale, expand_idx, expert_token_nums, ep_recv_counts, output[5], None]


def _combine_kwargs(case, style, me, d, expand_out, expand_idx, group_ep, group_tp):
    """The callers' combine keyword arguments (d: the dispatch kwargs, expand_idx as given)."""
    cfg = R.Cfg(case)
    T = cfg.T
    e, p = RANK // T, RANK % T
    topk_weights = torch.from_numpy(me["cws"])
    _, _, _, _, ep_recv_counts, tp_recv_counts, expand_scales = d
    if style in ("vllm_a3", "vllm_a2"):
        kw = {"expand_x": expand_out, "expert_ids": torch.from_numpy(me["ids"]),
              "expert_scales": topk_weights.to(torch.float32), "expert_shard_type": 0,
              "shared_expert_rank_num": 0, "moe_expert_num": cfg.E, "global_bs": cfg.gbs}
        if cfg.gbs == 0:
            kw["x_active_mask"] = (torch.from_numpy(np.asarray(me["mask"]))
                                   if me["mask"] is not None else None)
        if cfg.quant:  # dispatch_with_quant: vllm-ascend passes an empty tp_recv_counts
            tp_recv_counts = torch.empty(1, dtype=torch.int32)
        kw.update({"ep_send_counts": ep_recv_counts, "group_ep": group_ep, "ep_world_size": cfg.W,
                   "ep_rank_id": e, "expand_scales": expand_scales, "comm_quant_mode": 0,
                   "expand_idx": expand_idx})
        if style == "vllm_a3":
            kw.update({"tp_send_counts": tp_recv_counts, "group_tp": group_ep,
                       "tp_world_size": 1, "tp_rank_id": 0})
        return kw
    if style == "sglang":
        return {"expand_x": expand_out, "expert_ids": torch.from_numpy(me["ids"]).to(torch.int32),
                "expand_idx": expand_idx, "expert_scales": topk_weights.to(torch.float32),
                "expert_shard_type": 0, "shared_expert_rank_num": 0, "moe_expert_num": cfg.E,
                "global_bs": cfg.gbs, "ep_send_counts": ep_recv_counts, "group_ep": group_ep,
                "ep_world_size": cfg.W, "ep_rank_id": dist.get_rank(),
                "tp_send_counts": tp_recv_counts, "group_tp": group_ep, "tp_world_size": 1,
                "tp_rank_id": 0}
    if style == "omni":
        return {"expand_x": expand_out, "expert_ids": torch.from_numpy(me["ids"]),
                "expand_idx": expand_idx, "expert_scales": topk_weights.to(torch.float32),
                "expert_shard_type": 0, "shared_expert_rank_num": cfg.S, "moe_expert_num": cfg.E,
                "global_bs": cfg.gbs, "ep_send_counts": ep_recv_counts, "group_ep": group_ep,
                "ep_world_size": cfg.W, "ep_rank_id": e, "tp_send_counts": tp_recv_counts,
                "group_tp": group_tp if cfg.tp == 2 else group_ep, "tp_world_size": cfg.tp,
                "tp_rank_id": p,
                "x_active_mask": (torch.from_numpy(np.asarray(me["mask"]))
                                  if me["mask"] is not None else None)}
    return {"expand_x": expand_out, "expert_ids": torch.from_numpy(me["ids"]),
            "expand_idx": expand_idx, "ep_send_counts": ep_recv_counts,
            "expert_scales": topk_weights, "group_ep": group_ep, "ep_world_size": cfg.W,
            "ep_rank_id": e, "moe_expert_num": cfg.E}


def _combine_v1(style, kw):
    if style == "positional":
        return ops.npu_moe_distribute_combine(kw["expand_x"], kw["expert_ids"], kw["expand_idx"],
                                              kw["ep_send_counts"], kw["expert_scales"],
                                              kw["group_ep"], kw["ep_world_size"],
                                              kw["ep_rank_id"], kw["moe_expert_num"])
    return ops.npu_moe_distribute_combine(**kw)


def run_case(case):
    cfg = R.Cfg(case)
    style = case["style"]
    group_ep, group_tp = groups(cfg.T)
    inputs, rng = make_inputs(case)
    ref = R.dispatch_world(case, inputs)
    me, r = inputs[RANK], ref[RANK]
    dkw = _dispatch_kwargs(case, style, me, group_ep, group_tp)
    got = _unpack(style, _dispatch_v1(style, dkw))
    # the V2 operator on the same inputs
    v2kw = {k: v for k, v in dkw.items() if k not in ("x", "expert_ids", "group_ep", "ep_world_size",
                                                       "ep_rank_id", "moe_expert_num")}
    v2 = ops.npu_moe_distribute_dispatch_v2(dkw["x"], dkw["expert_ids"], dkw["group_ep"],
                                            dkw["ep_world_size"], dkw["ep_rank_id"],
                                            dkw["moe_expert_num"], **v2kw)
    names = ("expand_x", "dynamic_scales", "expand_idx", "tok", "counts", "tp_counts",
             "expand_scales")
    for i, n in enumerate(names):
        if got[i] is None:
            continue
        if i == 2:
            want = R.expand_idx_v1(me["ids"], me["mask"], cfg.E)
            same("dispatch expand_idx (V1 rule)", got[i], want)
            continue
        same(f"dispatch {n} (model)", got[i], r[n])
        _bits_equal(f"dispatch {n} (V2)", got[i], v2[i])
    # experts, then the callers' combine
    eo = expert_outputs(case, ref, rng)
    cref = R.combine_world(case, inputs, ref, eo)[RANK]["x"]
    expand_out = bits_tensor(eo[RANK], cfg.xt)
    full = list(got)
    full[5] = full[5] if full[5] is not None else v2[5]
    full[6] = full[6] if full[6] is not None else v2[6]
    ckw = _combine_kwargs(case, style, me, full, expand_out, got[2], group_ep, group_tp)
    x1 = _combine_v1(style, ckw)
    same("combine x (model)", x1, cref)
    c2 = {k: v for k, v in ckw.items() if k not in ("expand_x", "expert_ids", "expand_idx",
                                                     "ep_send_counts", "expert_scales", "group_ep",
                                                     "ep_world_size", "ep_rank_id",
                                                     "moe_expert_num")}
    x2 = ops.npu_moe_distribute_combine_v2(expand_out, ckw["expert_ids"], v2[2],
                                           ckw["ep_send_counts"], ckw["expert_scales"],
                                           ckw["group_ep"], ckw["ep_world_size"],
                                           ckw["ep_rank_id"], ckw["moe_expert_num"], **c2)
    _bits_equal("combine x (V2)", x1, x2)
    # a copy of expand_idx: the triples are rebuilt by a metadata-only V2 dispatch
    x3 = _combine_v1(style, dict(ckw, expand_idx=got[2].clone()))
    _bits_equal("combine x (copied expand_idx)", x1, x3)
    # combine_add_rms_norm takes the V1 expand_idx too
    resid = torch.from_numpy(np.ascontiguousarray(
        R.narrow(rng.normal(0, 1, size=(me["ids"].shape[0], 1, cfg.H)).astype(np.float32), cfg.xt))
        .view(np.int16)).view(expand_out.dtype)
    gamma = torch.ones(cfg.H, dtype=expand_out.dtype)
    akw = dict(tp_send_counts=ckw.get("tp_send_counts"), x_active_mask=ckw.get("x_active_mask"),
               group_tp=ckw.get("group_tp", ""), tp_world_size=ckw.get("tp_world_size", 0),
               tp_rank_id=ckw.get("tp_rank_id", 0), shared_expert_rank_num=cfg.S,
               global_bs=cfg.gbs)
    pos = (ckw["ep_send_counts"], ckw["expert_scales"], resid, gamma, ckw["group_ep"],
           ckw["ep_world_size"], ckw["ep_rank_id"], ckw["moe_expert_num"])
    y1 = ops.npu_moe_distribute_combine_add_rms_norm(expand_out, ckw["expert_ids"], got[2], *pos, **akw)
    y2 = ops.npu_moe_distribute_combine_add_rms_norm(expand_out, ckw["expert_ids"], v2[2], *pos, **akw)
    for a, b, n in zip(y1, y2, ("y", "rstd", "x")):
        _bits_equal(f"combine_add_rms_norm {n} (V1 expand_idx vs V2 assist)", a, b)


def mixed_paths(group_ep):
    """Rank 0 passes a copy of expand_idx (metadata dispatch first), the others the original
    (combine first): CALL_MISMATCH on every rank, nothing hangs, the next call works."""
    W = WORLD
    ids = torch.tensor([[0, 1], [1, 2], [3, 0]], dtype=torch.int32)
    x = torch.ones(3, 16, dtype=torch.bfloat16)
    out = ops.npu_moe_distribute_dispatch(x, ids, group_ep, W, RANK, 2 * W)
    w = torch.full((3, 2), 0.5)
    idx = out[2].clone() if RANK == 0 else out[2]
    try:
        ops.npu_moe_distribute_combine(out[0], ids, idx, out[4], w, group_ep, W, RANK, 2 * W)
        raise AssertionError("mixed expand_idx paths did not fail")
    except MegaMoeError as e:
        if e.name != "CALL_MISMATCH" or "dispatch_v2" not in str(e) or "combine_v2" not in str(e):
            raise AssertionError(f"expected CALL_MISMATCH, got {e.name}: {e}") from e
    y = ops.npu_moe_distribute_combine(out[0], ids, out[2], out[4], w, group_ep, W, RANK, 2 * W)
    if not torch.equal(y, (x.float() * 1.0).to(torch.bfloat16)):  # 0.5 * x + 0.5 * x
        raise AssertionError("the call after the mismatch gave a wrong result")


def main():
    out = sys.argv[1]
    dist.init_process_group("gloo", rank=RANK, world_size=WORLD)
    results = {}
    for case in CASES[WORLD]:
        try:
            run_case(case)
            results[case["name"]] = "ok"
        except Exception:  # noqa: BLE001 - every failure is reported per case
            results[case["name"]] = traceback.format_exc()
            if "TIMEOUT" in results[case["name"]]:
                break
    try:
        mixed_paths(groups(1)[0])
        results["mixed_expand_idx_paths"] = "ok"
    except Exception:  # noqa: BLE001
        results["mixed_expand_idx_paths"] = traceback.format_exc()
    with open(f"{out}.{RANK}.json", "w") as f:
        json.dump(results, f)
    ops.release()
    mcomm.shutdown()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
