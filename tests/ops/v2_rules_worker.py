"""One rank of the validation-rule tests (v2_rules.py): runs under `megamoe launch -n 2|4`.

usage: v2_rules_worker.py WORLD OUT_PREFIX
For every rule of this world size: the rule's ranks mutate a valid call, every rank calls, and
the status and message each rank got are recorded; then a valid call must still work (the
failed call left no state behind). Results: OUT_PREFIX.<rank>.json.
"""
import json
import os
import sys
import traceback

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from v2_rules import BS, H, K, RULES  # noqa: E402

import megamoe.comm as mcomm  # noqa: E402
import megamoe.ops as ops  # noqa: E402
from megamoe.errors import MegaMoeError  # noqa: E402

RANK = int(os.environ["RANK"])
WORLD = int(os.environ["WORLD_SIZE"])


def base_dispatch(names):
    g = torch.Generator().manual_seed(100 + RANK)
    x = torch.randn(BS, H, generator=g).to(torch.bfloat16)
    if WORLD == 2:
        ids = torch.stack([torch.randperm(4, generator=g)[:K] for _ in range(BS)]).int()
        return dict(x=x, expert_ids=ids, group_ep=names["world"], ep_world_size=2,
                    ep_rank_id=RANK, moe_expert_num=4, group_world=names["world"])
    ids = torch.stack([torch.randperm(2, generator=g)[:K] for _ in range(BS)]).int()
    return dict(x=x, expert_ids=ids, group_ep=names["ep"], ep_world_size=2, ep_rank_id=RANK // 2,
                moe_expert_num=2, group_tp=names["tp"], tp_world_size=2, tp_rank_id=RANK % 2,
                group_world=names["world"])


_PASS = ("group_tp", "tp_world_size", "tp_rank_id", "expert_shard_type", "shared_expert_num",
         "shared_expert_rank_num", "global_bs", "comm_alg", "zero_expert_num", "copy_expert_num",
         "const_expert_num", "x_active_mask", "elastic_info")


def call_dispatch(a):
    kw = {k: v for k, v in a.items() if k not in ("x", "expert_ids", "group_ep", "ep_world_size",
                                                   "ep_rank_id", "moe_expert_num", "group_world")}
    if kw.get("y_dtype") == "fp8":
        kw["y_dtype"] = ops.float8_e4m3fn
    return ops.npu_moe_distribute_dispatch_v2(a["x"], a["expert_ids"], a["group_ep"],
                                              a["ep_world_size"], a["ep_rank_id"],
                                              a["moe_expert_num"], **kw)


def base_combine(d):
    outs = call_dispatch(d)
    c = dict(expand_x=outs[0], expert_ids=d["expert_ids"], assist_info_for_combine=outs[2],
             ep_send_counts=outs[4], expert_scales=torch.full((BS, K), 0.5),
             group_ep=d["group_ep"], ep_world_size=d["ep_world_size"],
             ep_rank_id=d["ep_rank_id"], moe_expert_num=d["moe_expert_num"])
    for k in ("group_tp", "tp_world_size", "tp_rank_id"):
        if k in d:
            c[k] = d[k]
    if WORLD == 4:
        c["tp_send_counts"] = outs[5]
    return c


def call_combine(c, arn=False):
    pos = ("expand_x", "expert_ids", "assist_info_for_combine", "ep_send_counts", "expert_scales")
    tail = ("group_ep", "ep_world_size", "ep_rank_id", "moe_expert_num")
    kw = {k: v for k, v in c.items() if k not in pos + tail + ("residual_x", "gamma")}
    if arn:
        return ops.npu_moe_distribute_combine_add_rms_norm(
            *[c[k] for k in pos], c["residual_x"], c["gamma"], *[c[k] for k in tail], **kw)
    return ops.npu_moe_distribute_combine_v2(*[c[k] for k in pos], *[c[k] for k in tail], **kw)


def clone(a):
    return {k: (v.clone() if isinstance(v, torch.Tensor) else v) for k, v in a.items()}


def main():
    out = sys.argv[2]
    dist.init_process_group("gloo", rank=RANK, world_size=WORLD)
    names = {"world": mcomm.group_name(None)}
    if WORLD == 4:
        eps = [dist.new_group([0, 2]), dist.new_group([1, 3])]
        tps = [dist.new_group([0, 1]), dist.new_group([2, 3])]
        names["ep"] = mcomm.group_name(eps[RANK % 2])
        names["tp"] = mcomm.group_name(tps[RANK // 2])
    results = {}
    for rule in RULES:
        if rule["world"] != WORLD:
            continue
        d = base_dispatch(names)
        try:
            if rule["op"] == "dispatch":
                a = clone(d)
                if rule["on"] == "all" or rule["on"] == RANK:
                    rule["mutate"](a, RANK)
                call_dispatch(a)
            elif rule["op"] == "order":
                if RANK == rule["on"]:
                    call_combine(base_combine(d))  # dispatch inside, then combine: one op late
                else:
                    call_dispatch(d)
                    call_dispatch(d)
            else:
                c = clone(base_combine(d))
                if rule["op"] == "arn":
                    c["residual_x"] = torch.randn(BS, 1, H).to(torch.bfloat16)
                    c["gamma"] = torch.ones(H, dtype=torch.bfloat16)
                if rule["on"] == "all" or rule["on"] == RANK:
                    rule["mutate"](c, RANK)
                call_combine(c, arn=rule["op"] == "arn")
            res = {"status": "OK", "message": ""}
        except MegaMoeError as e:
            res = {"status": e.name, "message": str(e)}
        except Exception:  # noqa: BLE001
            res = {"status": "PYTHON", "message": traceback.format_exc()}
        try:  # the next valid call works
            call_dispatch(base_dispatch(names))
            res["after"] = "ok"
        except Exception as e:  # noqa: BLE001
            res["after"] = repr(e)
        results[rule["name"]] = res
        if res["after"] != "ok" and "TIMEOUT" in res["after"]:
            break
    with open(f"{out}.{RANK}.json", "w") as f:
        json.dump(results, f)
    ops.release()
    mcomm.shutdown()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
