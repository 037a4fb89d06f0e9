"""One rank of the randomised operator tests: runs under `megamoe launch -n N`.

usage: v2_worker.py CASES.json OUT_PREFIX
Every rank builds the same global inputs for each case (seeded), runs dispatch_v2 and
combine_v2 (or combine_add_rms_norm) through megamoe.ops on its own part, and compares every
output bit for bit with the numpy model (v2_ref.py, which never calls the library). Results go
to OUT_PREFIX.<rank>.json as {case name: "ok" | error text}.
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

import megamoe.comm as mcomm  # noqa: E402
import megamoe.ops as ops  # noqa: E402

RANK = int(os.environ["RANK"])
WORLD = int(os.environ["WORLD_SIZE"])
_XT = {R.BF16: torch.bfloat16, R.FP16: torch.float16}
_YT = {R.INT8: torch.int8, R.E4M3: ops.float8_e4m3fn, R.E5M2: ops.float8_e5m2}


def bits_tensor(bits, xt):
    return torch.from_numpy(np.ascontiguousarray(bits).view(np.int16)).view(_XT[xt])


def tensor_bits(t):
    if t.dtype in (torch.bfloat16, torch.float16):
        return t.contiguous().view(torch.int16).numpy().view(np.uint16)
    if t.dtype == torch.float32:
        return t.contiguous().numpy().view(np.uint32)
    if t.dtype == torch.int8 or t.element_size() == 1 and t.dtype.is_floating_point:
        # int8, and torch >= 2.1's float8 outputs: their bytes
        return t.contiguous().view(torch.uint8).numpy()
    return t.contiguous().numpy()


def ref_bits(a):
    a = np.asarray(a)
    if a.dtype == np.float32:
        return a.view(np.uint32)
    if a.dtype == np.int8:
        return a.view(np.uint8)
    return a


def same(name, got, want):
    g, w = tensor_bits(got), ref_bits(want)
    if g.shape != w.shape:
        raise AssertionError(f"{name}: shape {g.shape} != reference {w.shape}")
    if not np.array_equal(g, w):
        bad = np.argwhere(g != w)
        i = tuple(bad[0])
        raise AssertionError(f"{name}: {len(bad)} elements differ; first at {i}: got {g[i]}, "
                             f"reference {w[i]}")


# ---- groups --------------------------------------------------------------------------------

_groups = {}


def groups(T):
    """(group_ep name, group_tp name) for this rank under world layout ep = r // T, tp = r % T."""
    if T in _groups:
        return _groups[T]
    if T == 1:
        _groups[T] = (mcomm.group_name(None), "")
        return _groups[T]
    W = WORLD // T
    ep_pgs = [dist.new_group([e * T + p for e in range(W)]) for p in range(T)]
    tp_pgs = [dist.new_group([e * T + p for p in range(T)]) for e in range(W)]
    ep = mcomm.group_name(ep_pgs[RANK % T])
    tp = mcomm.group_name(tp_pgs[RANK // T])
    _groups[T] = (ep, tp)
    return _groups[T]


# ---- inputs ---------------------------------------------------------------------------------

def make_inputs(case):
    cfg = R.Cfg(case)
    rng = np.random.default_rng(case["seed"])
    T, W, K, H = cfg.T, cfg.W, cfg.K, cfg.H
    eW, eS, eE, t1, t2 = R.effective(cfg)
    n_total = cfg.E + cfg.Z + cfg.Cp + cfg.Cn
    special = list(range(cfg.E, n_total))
    inputs = []
    bss = case.get("bs_list") or [case["bs"]] * (W * T)
    shared_scales = None
    if case.get("scales") == "full":
        shared_scales = rng.uniform(0.5, 2.0, size=(cfg.NS + cfg.E, H)).astype(np.float32)
    elif case.get("scales") == "flat":
        shared_scales = rng.uniform(0.5, 2.0, size=(H,)).astype(np.float32)
    elif case.get("scales") == "one":
        shared_scales = np.array([1.75], np.float32)
    consts = None
    if cfg.Cn:
        consts = [R.narrow(rng.normal(0, 0.05, size=(cfg.Cn, H)).astype(np.float32), cfg.xt)
                  for _ in range(3)]
    for wr in range(W * T):
        bs = bss[wr]
        x = R.narrow(rng.normal(0, 1.5, size=(bs, H)).astype(np.float32), cfg.xt)
        if bs > 1 and case.get("zero_row", True):
            x[1] = 0
        moe_ids = list(range(eE))
        ids = np.zeros((bs, K), np.int32)
        for t in range(bs):
            pool = moe_ids + special * 2 if special else moe_ids
            pick = rng.choice(len(pool), size=K, replace=False)
            ids[t] = [pool[i] for i in pick]
        mask = None
        if case.get("mask") == 1:
            n = int(rng.integers(0, bs + 1))
            mask = np.arange(bs) < n
        elif case.get("mask") == 2:
            mask = rng.random((bs, K)) < 0.7
            if bs > 2:
                mask[2] = False
        ws = rng.uniform(0.1, 1.0, size=(bs, K)).astype(np.float32) if case.get("ws") else None
        cws = rng.uniform(0.1, 1.0, size=(bs, K)).astype(np.float32)
        d = {"x": x, "ids": ids, "mask": mask, "ws": ws, "cws": cws, "scales": shared_scales}
        if case.get("sxx"):
            d["sxx"] = R.narrow(rng.normal(0, 1, size=(bs, H)).astype(np.float32), cfg.xt)
        if cfg.Cp or cfg.Cn:
            d["ori_x"] = x
        if consts:
            d["alpha1"], d["alpha2"], d["const_v"] = consts
        inputs.append(d)
    return inputs, rng


def expert_outputs(case, disp, rng):
    """What the experts computed: random rows, or the dispatched rows themselves (identity);
    "edge" puts the MX transport's corner blocks into every row (see _edge_blocks)."""
    cfg = R.Cfg(case)
    outs = {}
    for wr, o in sorted(disp.items()):
        if case.get("identity"):
            outs[wr] = o["expand_x"].astype(np.uint16)
        else:
            v = rng.normal(0, 1, size=o["expand_x"].shape).astype(np.float32)
            if case.get("edge"):
                _edge_blocks(v, cfg.xt, rng)
            outs[wr] = R.narrow(v, cfg.xt)
    return outs


def _edge_blocks(v, xt, rng):
    """Column block b (32 elements, as the MX transport's) of every row gets pattern b % 6: all
    zeros (scale byte 0); values so small that the largest exponent field is <= 8 (bf16: scale
    byte 0 although q is not 0) or fp16 subnormals; large values (bf16 1e30 / fp16 3e4: big
    scale bytes, saturation at the top code); one large element among small ones (the small q
    flush to 0); signed zeros; unchanged. The same pattern in all rows keeps a token's sum of
    them visible in its output."""
    big = 1e30 if xt == R.BF16 else 3.0e4
    tiny = 2.0 ** -122 if xt == R.BF16 else 2.0 ** -20
    rows, h = v.shape
    for b in range(0, h, 32):
        w = min(32, h - b)
        p = (b // 32) % 6
        if p == 0:
            v[:, b:b + w] = 0
        elif p == 1:
            v[:, b:b + w] = rng.normal(0, 1, (rows, w)) * tiny
        elif p == 2:
            v[:, b:b + w] = rng.normal(0, 1, (rows, w)) * big
        elif p == 3:
            v[:, b:b + w] = rng.normal(0, 1e-4, (rows, w))
            v[:, b] = big / 3
        elif p == 4:
            v[:, b:b + w] = np.where(rng.random((rows, w)) < 0.5, -0.0, 0.0)


# ---- one case -------------------------------------------------------------------------------

def run_case(case):
    if case.get("hier") == "host":
        # hierarchy with MEGAMOE_RANKS_PER_NODE unset: the groups are the hosts (the model's
        # group size is the launcher's ranks per host)
        case = dict(case, hier=int(os.environ["LOCAL_WORLD_SIZE"]))
        os.environ.pop("MEGAMOE_RANKS_PER_NODE", None)
    elif case.get("hier"):
        os.environ["MEGAMOE_RANKS_PER_NODE"] = str(case["hier"])
    cfg = R.Cfg(case)
    T = cfg.T
    if cfg.W * T != WORLD:
        raise AssertionError(f"case needs {cfg.W * T} ranks, world has {WORLD}")
    group_ep, group_tp = groups(T)
    inputs, rng = make_inputs(case)
    ref = R.dispatch_world(case, inputs)
    me = inputs[RANK]
    e, p = RANK // T, RANK % T
    common = dict(group_tp=group_tp, tp_world_size=cfg.tp, tp_rank_id=p if cfg.tp == 2 else 0,
                  shared_expert_num=case.get("NS", 1), shared_expert_rank_num=cfg.S,
                  global_bs=cfg.gbs, comm_alg="hierarchy" if cfg.hier else case.get("alg", ""),
                  zero_expert_num=cfg.Z, copy_expert_num=cfg.Cp, const_expert_num=cfg.Cn)
    elastic = torch.tensor(cfg.elastic, dtype=torch.int32) if cfg.elastic is not None else None
    x = bits_tensor(me["x"], cfg.xt)
    ids = torch.from_numpy(me["ids"])
    mask = torch.from_numpy(np.asarray(me["mask"])) if me["mask"] is not None else None
    scales = torch.from_numpy(me["scales"]) if me["scales"] is not None else None
    ws = torch.from_numpy(me["ws"]) if me["ws"] is not None else None
    perf = torch.full((cfg.W,), 7, dtype=torch.int64) if case.get("perf") else None
    outs = ops.npu_moe_distribute_dispatch_v2(
        x, ids, group_ep, cfg.W, e, cfg.E, scales=scales, x_active_mask=mask, expert_scales=ws,
        elastic_info=elastic, performance_info=perf, quant_mode=cfg.quant,
        expert_token_nums_type=cfg.ent, y_dtype=_YT.get(cfg.yt) if cfg.quant else None, **common)
    r = ref[RANK]
    names = ("expand_x", "dynamic_scales", "assist", "tok", "counts", "tp_counts", "expand_scales")
    for n, got in zip(names, outs):
        same(f"dispatch {n}", got, r[n])
    if perf is not None and not bool((perf >= 7).all()):
        raise AssertionError(f"performance_info did not accumulate: {perf.tolist()}")
    if case.get("no_combine"):
        return
    eo = expert_outputs(case, ref, rng)
    arn = None
    if case.get("arn"):
        arn = {}
        for wr in range(WORLD):
            bs = inputs[wr]["ids"].shape[0]
            arn[wr] = {"residual": R.narrow(rng.normal(0, 1, size=(bs, cfg.H)).astype(np.float32), cfg.xt),
                       "gamma": R.narrow(rng.uniform(0.5, 1.5, size=(cfg.H,)).astype(np.float32), cfg.xt),
                       "eps": case.get("eps", 1e-6)}
    cref = R.combine_world(case, inputs, ref, eo, arn)
    kw = dict(tp_send_counts=outs[5], x_active_mask=mask, expand_scales=outs[6],
              elastic_info=elastic, comm_quant_mode=cfg.cq, **common)
    if "sxx" in me:
        kw["shared_expert_x"] = bits_tensor(me["sxx"], cfg.xt)
    if "ori_x" in me:
        kw["ori_x"] = bits_tensor(me["ori_x"], cfg.xt)
    if "alpha1" in me:
        kw["const_expert_alpha_1"] = bits_tensor(me["alpha1"], cfg.xt)
        kw["const_expert_alpha_2"] = bits_tensor(me["alpha2"], cfg.xt)
        kw["const_expert_v"] = bits_tensor(me["const_v"], cfg.xt)
    expand = bits_tensor(eo[RANK], cfg.xt)
    cws = torch.from_numpy(me["cws"])
    if arn is None:
        perf2 = torch.zeros(cfg.W, dtype=torch.int64) if case.get("perf") else None
        got = ops.npu_moe_distribute_combine_v2(expand, ids, outs[2], outs[4], cws, group_ep,
                                                cfg.W, e, cfg.E, performance_info=perf2, **kw)
        same("combine x", got, cref[RANK]["x"])
        if cfg.hier:  # hierarchy = fullmesh up to fp32 re-association (then one rounding)
            flat = dict(case, hier=0)
            fm = R.combine_world(flat, inputs, ref, eo)[RANK]["x"]
            g, f = R.widen(tensor_bits(got), cfg.xt), R.widen(fm, cfg.xt)
            if not np.allclose(g, f, rtol=2.0 ** -6, atol=1e-3):
                raise AssertionError(f"hierarchy differs from fullmesh beyond re-association: "
                                     f"max |diff| {np.max(np.abs(g - f))}")
        if case.get("identity") and not any((cfg.NS, cfg.Z, cfg.Cp, cfg.Cn, cfg.cq, cfg.tp)) \
                and me["mask"] is None and "sxx" not in me:
            # dispatch then identity experts: x = sum_k scale_k * x, in fp32, one rounding
            xf = R.widen(me["x"], cfg.xt)
            acc = np.zeros_like(xf)
            for k in range(cfg.K):
                acc = (acc + (xf * me["cws"][:, k:k + 1]).astype(np.float32)).astype(np.float32)
            same("identity round trip", got, R.narrow(acc, cfg.xt))
    else:
        kw.pop("expand_scales")
        a = arn[RANK]
        y, rstd, xo = ops.npu_moe_distribute_combine_add_rms_norm(
            expand, ids, outs[2], outs[4], cws,
            bits_tensor(a["residual"], cfg.xt).reshape(-1, 1, cfg.H), bits_tensor(a["gamma"], cfg.xt),
            group_ep, cfg.W, e, cfg.E, norm_eps=a["eps"],
            **kw)
        same("add_rms_norm x", xo.reshape(-1, cfg.H), cref[RANK]["x"])
        same("add_rms_norm y", y.reshape(-1, cfg.H), cref[RANK]["y"])
        same("add_rms_norm rstd", rstd.reshape(-1), cref[RANK]["rstd"])


def main():
    cases = json.load(open(sys.argv[1]))
    out = sys.argv[2]
    dist.init_process_group("gloo", rank=RANK, world_size=WORLD)
    results = {}
    for case in cases:
        try:
            run_case(case)
            results[case["name"]] = "ok"
        except Exception:  # noqa: BLE001 - every failure is reported per case
            results[case["name"]] = traceback.format_exc()
            if "MegaMoeError" in results[case["name"]] and "TIMEOUT" in results[case["name"]]:
                break
    with open(f"{out}.{RANK}.json", "w") as f:
        json.dump(results, f)
    ops.release()
    mcomm.shutdown()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
