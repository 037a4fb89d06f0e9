"""One rank of the torch.ops.megamoe checks on two ranks (tests/python/test_library.py), on the
torch of the interpreter: each check runs where that torch has the feature.

usage: library_worker.py OUT_PREFIX      (under `megamoe launch -n 2`)
Results: OUT_PREFIX.<rank>.json, {check: "ok" | error text}. Every rank runs the same checks in
the same order (the operators are collective).
"""
import json
import os
import sys
import traceback

import torch

import megamoe
import megamoe.comm as mcomm
import megamoe.ops as ops
from megamoe import _dtypes, _library

RANK = int(os.environ["RANK"])
WORLD = int(os.environ["WORLD_SIZE"])
BS, H, K, E = 8, 64, 2, 4
GROUP = None  # the world communicator's name, set in main()
V2 = (ops.npu_moe_distribute_dispatch_v2, ops.npu_moe_distribute_combine_v2,
      ops.npu_moe_distribute_combine_add_rms_norm)
HAS_FP8 = hasattr(torch, "float8_e4m3fn")
HAS_COMPILE = _library.HAS_AUTOGRAD and _library.HAS_EFFECTS


def inputs(seed):
    g = torch.Generator().manual_seed(seed * 10 + RANK)
    x = (torch.randn(BS, H, generator=g) * 2).to(torch.bfloat16)
    ids = torch.stack([torch.randperm(E, generator=g)[:K] for _ in range(BS)]).int()
    scales = torch.rand(BS, K, generator=g)
    return x, ids, scales


def bits(t):
    return t.contiguous().view(torch.uint8) if t.dtype.is_floating_point and t.dim() else t


def same(a, b, what):
    a = a if isinstance(a, (tuple, list)) else [a]
    b = b if isinstance(b, (tuple, list)) else [b]
    assert len(a) == len(b), f"{what}: {len(a)} vs {len(b)} outputs"
    for i, (u, v) in enumerate(zip(a, b)):
        assert u.dtype == v.dtype and u.shape == v.shape, \
            f"{what}[{i}]: {u.dtype}{tuple(u.shape)} vs {v.dtype}{tuple(v.shape)}"
        assert torch.equal(bits(u), bits(v)), f"{what}[{i}] differs"


def like(real, fake, what):
    real = real if isinstance(real, (tuple, list)) else [real]
    fake = fake if isinstance(fake, (tuple, list)) else [fake]
    assert len(real) == len(fake), f"{what}: {len(real)} vs {len(fake)} outputs"
    for i, (r, f) in enumerate(zip(real, fake)):
        assert r.dtype == f.dtype and tuple(r.shape) == tuple(f.shape), \
            f"{what}[{i}]: real {r.dtype}{tuple(r.shape)}, fake {f.dtype}{tuple(f.shape)}"


def meta(t):
    return t.to("meta") if isinstance(t, torch.Tensor) else t


def dispatch_cases():
    """(name, args, kwargs) of dispatches covering the output shapes and dtypes."""
    x, ids, scales = inputs(1)
    cases = [("plain", (x, ids, GROUP, WORLD, RANK, E), {}),
             ("expert_scales", (x, ids, GROUP, WORLD, RANK, E), {"expert_scales": scales}),
             ("int8", (x, ids, GROUP, WORLD, RANK, E), {"quant_mode": 2}),
             ("per_group_e5m2", (x, ids, GROUP, WORLD, RANK, E),
              {"quant_mode": 3, "y_dtype": megamoe.float8_e5m2}),
             ("mx_e4m3", (x, ids, GROUP, WORLD, RANK, E),
              {"quant_mode": 4, "y_dtype": megamoe.float8_e4m3fn}),
             ("npu_code_292", (x, ids, GROUP, WORLD, RANK, E),
              {"quant_mode": 2, "y_dtype": 292})]
    return cases


def combine_args(seed=2):
    x, ids, scales = inputs(seed)
    d = ops.npu_moe_distribute_dispatch_v2(x, ids, GROUP, WORLD, RANK, E, expert_scales=scales)
    return (d[0], ids, d[2], d[4], scales, GROUP, WORLD, RANK, E), x, d


def check_fake_shapes():
    """Meta tensors through megamoe.ops get the fake kernel: the same shapes and dtypes as
    the real call (the C infer function decides both)."""
    for name, args, kw in dispatch_cases():
        real = ops.npu_moe_distribute_dispatch_v2(*args, **kw)
        fake = ops.npu_moe_distribute_dispatch_v2(*[meta(a) for a in args],
                                                  **{k: meta(v) for k, v in kw.items()})
        assert all(t.device.type == "meta" for t in fake)
        like(real, fake, f"dispatch {name}")
    cargs, x, _ = combine_args()
    like(ops.npu_moe_distribute_combine_v2(*cargs),
         ops.npu_moe_distribute_combine_v2(*[meta(a) for a in cargs]), "combine_v2")
    g = torch.Generator().manual_seed(5 + RANK)
    residual = torch.randn(BS, 1, H, generator=g).to(torch.bfloat16)
    gamma = torch.rand(H, generator=g).to(torch.bfloat16)
    rargs = cargs[:5] + (residual, gamma) + cargs[5:]
    like(ops.npu_moe_distribute_combine_add_rms_norm(*rargs),
         ops.npu_moe_distribute_combine_add_rms_norm(*[meta(a) for a in rargs]), "add_rms_norm")
    x, ids, scales = inputs(3)
    v1 = ops.npu_moe_distribute_dispatch(x, ids, GROUP, WORLD, RANK, E, expert_scales=scales)
    like(v1, ops.npu_moe_distribute_dispatch(meta(x), meta(ids), GROUP, WORLD, RANK, E,
                                             expert_scales=meta(scales)), "V1 dispatch")
    v1c = (v1[0], ids, v1[2], v1[4], scales, GROUP, WORLD, RANK, E)
    like(ops.npu_moe_distribute_combine(*v1c),
         ops.npu_moe_distribute_combine(*[meta(a) for a in v1c]), "V1 combine")


def check_fake_tensor_mode():
    """FakeTensorMode (what torch.compile traces with) on the torch.ops directly."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    for name, args, kw in dispatch_cases():
        kw = dict(kw, y_dtype=_dtypes.npu_code(kw.get("y_dtype")))
        real = torch.ops.megamoe.npu_moe_distribute_dispatch_v2(*args, **kw)
        with FakeTensorMode() as mode:
            fake_of = (lambda a: mode.from_tensor(a) if isinstance(a, torch.Tensor) else a)
            fake = torch.ops.megamoe.npu_moe_distribute_dispatch_v2(
                *[fake_of(a) for a in args], **{k: fake_of(v) for k, v in kw.items()})
        like(real, fake, f"FakeTensorMode dispatch {name}")


def _opcheck(op, args, kwargs=None):
    res = torch.library.opcheck(op, args, kwargs or {})
    bad = {k: v for k, v in res.items() if v != "SUCCESS"}
    assert not bad, f"{op}: {bad}"


def check_opcheck():
    """torch.library.opcheck (schema, autograd registration, fake kernel, AOT dispatch) on
    every megamoe operator, the functional twins included."""
    mm = torch.ops.megamoe
    for name, args, kw in dispatch_cases():
        kw = dict(kw, y_dtype=_dtypes.npu_code(kw.get("y_dtype")))
        _opcheck(mm.npu_moe_distribute_dispatch_v2.default, args, kw)
        _opcheck(mm._npu_moe_distribute_dispatch_v2.default, args, kw)
    x, ids, scales = inputs(4)
    perf = torch.zeros(WORLD, dtype=torch.int64)
    _opcheck(mm.npu_moe_distribute_dispatch_v2.default, (x, ids, GROUP, WORLD, RANK, E),
             {"expert_scales": scales, "performance_info": perf})
    cargs, _, _ = combine_args(5)
    _opcheck(mm.npu_moe_distribute_combine_v2.default, cargs)
    # (the twins without performance_info: it accumulates measured times, which differ between
    # opcheck's eager and compiled runs by nature; the in-place operators above take it)
    _opcheck(mm._npu_moe_distribute_combine_v2.default, cargs)
    _opcheck(mm.npu_moe_distribute_combine_v2.default, cargs,
             {"performance_info": torch.zeros(WORLD, dtype=torch.int64)})
    g = torch.Generator().manual_seed(6 + RANK)
    residual = torch.randn(BS, 1, H, generator=g).to(torch.bfloat16)
    gamma = torch.rand(H, generator=g).to(torch.bfloat16)
    _opcheck(mm.npu_moe_distribute_combine_add_rms_norm.default,
             cargs[:5] + (residual, gamma) + cargs[5:])
    x, ids, scales = inputs(7)
    _opcheck(mm.npu_moe_distribute_dispatch.default, (x, ids, GROUP, WORLD, RANK, E),
             {"expert_scales": scales})
    d1 = ops.npu_moe_distribute_dispatch(x, ids, GROUP, WORLD, RANK, E, expert_scales=scales)
    # (opcheck copies its inputs: the combine takes the rebuild path, the same on every rank)
    _opcheck(mm.npu_moe_distribute_combine.default,
             (d1[0], ids, d1[2], d1[4], scales, GROUP, WORLD, RANK, E))
    # the experts pair, on a layer: the forward without a saved state (its saved-state output is
    # a fresh handle per call, which opcheck's eager-vs-compiled comparison cannot equal), the
    # backward on the state of one real forward (opcheck copies the handle tensor: a copy finds
    # the state while the original lives)
    torch.manual_seed(11)
    layer = megamoe.MegaMoeExperts(128, 64, 32, E, K, ep_size=WORLD).to(torch.bfloat16)
    g = torch.Generator().manual_seed(12 + RANK)
    hx = torch.randn(128, 64, generator=g).to(torch.bfloat16)
    hids = torch.stack([torch.randperm(E, generator=g)[:K] for _ in range(128)]).int()
    probs = torch.rand(128, K, generator=g)
    gu, dn = layer.gate_up_weight.detach(), layer.down_weight.detach()
    fwd = (layer._op_id, hx, hids, probs, None, gu, dn, False, False)
    _opcheck(mm.experts_forward.default, fwd)
    out, saved = mm.experts_forward(layer._op_id, hx, hids, probs, None, gu, dn, True, False)
    grad = torch.randn(128, 64, generator=g).to(torch.bfloat16)
    _opcheck(mm.experts_backward.default, (layer._op_id, saved, probs, gu, dn, grad))
    layer.close()


def check_compile_round_trip():
    """torch.compile(fullgraph=True) of dispatch -> combine through megamoe.ops (one graph,
    the operators traced by their fake kernels) equals eager bit for bit, on aot_eager and
    inductor; a dispatch whose results are unused still runs (an ordered side effect)."""
    x, ids, scales = inputs(8)
    perf = torch.zeros(WORLD, dtype=torch.int64)

    def round_trip(x, ids, scales, perf):
        ops.npu_moe_distribute_dispatch(x, ids, GROUP, WORLD, RANK, E)  # unused
        d = ops.npu_moe_distribute_dispatch_v2(x, ids, GROUP, WORLD, RANK, E,
                                               expert_scales=scales, performance_info=perf)
        y = d[0].float().mul(2).to(torch.bfloat16)  # "experts": some compute between
        return ops.npu_moe_distribute_combine_v2(y, ids, d[2], d[4], scales, GROUP, WORLD,
                                                 RANK, E)

    want = round_trip(x, ids, scales, perf)
    v1 = ops.npu_moe_distribute_dispatch
    for backend in ("aot_eager", "inductor"):
        torch._dynamo.reset()
        fn = torch.compile(round_trip, backend=backend, fullgraph=True)
        fn(x, ids, scales, perf)  # compiles
        before, p0 = v1.body_calls, perf.clone()
        got = fn(x, ids, scales, perf)
        same(got, want, f"compiled round trip ({backend})")
        assert v1.body_calls == before + 1, f"{backend}: the unused V1 dispatch was dropped"
        assert bool((perf >= p0).all()), f"{backend}: performance_info not accumulated"


def check_fp8_round_trip():
    """fp8 y_dtype: the outputs are float8 tensors (not bytes), their values are what the
    library's fp8 encoding means, and dequantised rows go through the combine to x * sum of
    scales within fp8's precision. e8m0 scales are uint8 (torch_npu's form)."""
    x, ids, scales = inputs(9)
    for y, mode in ((torch.float8_e4m3fn, 4), (torch.float8_e5m2, 4), (torch.float8_e4m3fn, 2),
                    (torch.float8_e5m2, 3)):
        d = ops.npu_moe_distribute_dispatch_v2(x, ids, GROUP, WORLD, RANK, E,
                                               expert_scales=scales, quant_mode=mode, y_dtype=y)
        q, s = d[0], d[1]
        assert q.dtype is y, q.dtype
        for code in (_dtypes.npu_code(y), 292 if y is torch.float8_e4m3fn else 291):
            same(ops.npu_moe_distribute_dispatch_v2(x, ids, GROUP, WORLD, RANK, E,
                                                    expert_scales=scales, quant_mode=mode,
                                                    y_dtype=code), d, f"y_dtype {code}")
        # the values torch reads are what the library wrote: the OCP fp8 decoding of the bytes
        raw = q.contiguous().view(torch.uint8).long()
        dec = _ocp_fp8_table(y is torch.float8_e4m3fn)[raw]
        assert torch.equal(q.float(), dec), f"{y}: torch's fp8 values differ from the library's"
        assert bool(raw.ne(0).any()), "no data"
        rows = q.float()
        if mode == 4:  # e8m0 block scales, 32 per block
            assert s.dtype is torch.uint8
            exp = (s.float() - 127).exp2()[:, :(H + 31) // 32]
            rows = rows * exp.repeat_interleave(32, dim=1)[:, :H]
        elif mode == 3:  # fp32 per 128-column group
            rows = rows * s.repeat_interleave(128, dim=1)[:, :H]
        else:  # one fp32 scale per row
            rows = rows * s.reshape(-1, 1)[:rows.shape[0]]
        out = ops.npu_moe_distribute_combine_v2(rows.to(torch.bfloat16), ids, d[2], d[4], scales,
                                                GROUP, WORLD, RANK, E)
        want = x.float() * scales.sum(1, keepdim=True)
        err = ((out.float() - want).norm() / want.norm()).item()
        limit = 0.05 if y is torch.float8_e4m3fn else 0.1
        assert err < limit, f"{y} quant_mode {mode}: round trip relative error {err:.3f}"


def _ocp_fp8_table(e4m3fn):
    """fp32 value of each of the 256 fp8 bytes (OCP FP8: e4m3fn bias 7 no Inf, e5m2 bias 15)."""
    ebits, mbits, bias = (4, 3, 7) if e4m3fn else (5, 2, 15)
    vals = []
    for b in range(256):
        sign = -1.0 if b & 0x80 else 1.0
        e, m = (b >> mbits) & ((1 << ebits) - 1), b & ((1 << mbits) - 1)
        if e4m3fn and e == 15 and m == 7:
            v = float("nan")
        elif not e4m3fn and e == 31:
            v = float("inf") if m == 0 else float("nan")
        elif e == 0:
            v = m / (1 << mbits) * 2.0 ** (1 - bias)
        else:
            v = (1 + m / (1 << mbits)) * 2.0 ** (e - bias)
        vals.append(sign * v)
    return torch.tensor(vals, dtype=torch.float32)


def check_default_device():
    """Outputs are made on the CPU whatever torch.set_default_device says."""
    x, ids, scales = inputs(10)
    want = ops.npu_moe_distribute_dispatch_v2(x, ids, GROUP, WORLD, RANK, E, expert_scales=scales)
    torch.set_default_device("meta")
    try:
        got = ops.npu_moe_distribute_dispatch_v2(x, ids, GROUP, WORLD, RANK, E,
                                                 expert_scales=scales)
        comb = ops.npu_moe_distribute_combine_v2(got[0], ids, got[2], got[4], scales, GROUP,
                                                 WORLD, RANK, E)
        v1 = ops.npu_moe_distribute_dispatch(x, ids, GROUP, WORLD, RANK, E)
    finally:
        torch.set_default_device("cpu")
    same(got, want, "dispatch under set_default_device('meta')")
    assert comb.device.type == "cpu" and all(t.device.type == "cpu" for t in v1)


def check_inference_mode():
    """Inference tensors in and out, the layer's per-call weights included: under
    torch.inference_mode() the layer equals no_grad, and new weight tensors are used."""
    x, ids, scales = inputs(11)
    want = ops.npu_moe_distribute_dispatch_v2(x, ids, GROUP, WORLD, RANK, E, expert_scales=scales)
    with torch.inference_mode():
        got = ops.npu_moe_distribute_dispatch_v2(x.clone(), ids.clone(), GROUP, WORLD, RANK, E,
                                                 expert_scales=scales.clone())
        out = ops.npu_moe_distribute_combine_v2(got[0], ids, got[2], got[4], scales, GROUP,
                                                WORLD, RANK, E)
    same(got, want, "dispatch under inference_mode")
    assert out.is_inference()
    torch.manual_seed(13)
    layer = megamoe.MegaMoeExperts(128, 64, 32, E, K, ep_size=WORLD, create_parameters=False)
    g = torch.Generator().manual_seed(14 + RANK)
    local = E // WORLD
    w1 = [(torch.randn(local, 64, 64, generator=g) * 0.05).to(torch.bfloat16),
          (torch.randn(local, 32, 64, generator=g) * 0.05).to(torch.bfloat16)]
    w2 = [w * 2 for w in w1]
    hx = torch.randn(128, 64, generator=g).to(torch.bfloat16)
    hids = torch.stack([torch.randperm(E, generator=g)[:K] for _ in range(128)]).int()
    probs = torch.rand(128, K, generator=g)
    with torch.no_grad():
        ref1 = layer(hx, hids, probs, expert_weights=w1)
        ref2 = layer(hx, hids, probs, expert_weights=w2)
    with torch.inference_mode():
        i1 = [w.clone() for w in w1]
        i2 = [w.clone() for w in w2]
        a = layer(hx, hids, probs, expert_weights=i1)
        b = layer(hx, hids, probs, expert_weights=i2)  # other tensors: re-packed
        c = layer(hx, hids, probs, expert_weights=i1)
    same([a, b, c], [ref1, ref2, ref1], "MegaMoeExperts under inference_mode")
    assert not torch.equal(bits(ref1), bits(ref2))
    layer.close()


def main():
    global GROUP
    prefix = sys.argv[1]
    GROUP = mcomm.group_name(None)
    checks = [("fake_shapes", check_fake_shapes), ("inference_mode", check_inference_mode)]
    if _library.TORCH_VERSION >= (2, 0):
        checks.append(("default_device", check_default_device))
    if HAS_FP8:
        checks.append(("fp8_round_trip", check_fp8_round_trip))
    if HAS_COMPILE:
        checks += [("fake_tensor_mode", check_fake_tensor_mode), ("opcheck", check_opcheck),
                   ("compile_round_trip", check_compile_round_trip)]
    res = {}
    for name, fn in checks:
        try:
            fn()
            res[name] = "ok"
        except Exception:  # recorded for the test to show; the other ranks go on
            res[name] = traceback.format_exc()[-3000:]
    with open(f"{prefix}.{RANK}.json", "w") as f:
        json.dump(res, f)
    mcomm.shutdown()


if __name__ == "__main__":
    main()
