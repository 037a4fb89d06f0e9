"""Qwen-MoE optimizer-step benchmark: A (CommonEPExperts, plain torch) vs B (MegaMoeExperts).

    megamoe launch -n 2 -- /usr/bin/python3 examples/qwen_moe/benchmark.py [flags]
    /usr/bin/python3 -m torch.distributed.run --nproc_per_node 2 --redirects 2 --tee 2 \
        examples/qwen_moe/benchmark.py [flags]

Both models are built from the same seed; A's dense weights and expert shards are copied from
B's, and the copy is checked bit for bit. First step (B routed like A): the loss, the logits,
every local gradient and every parameter after one AdamW step (fp32 master weights) of B are
compared with A's on every rank by the project's rule (bench/moe_verify.h): the loss and the
parameters elementwise (rtol 2e-2 |A| + atol 2e-3 max(1, max |A|)), the logits and gradients by
relative L2 <= 1 % and max |err| <= 2 % of max |A| (README.md says why; where torch accumulates
bf16 matmuls in bf16, see NormRule). Then warm-up and measured optimizer steps, A and B
interleaved step by step so both see the same machine load; each step's time is the slowest
rank's. Rank 0 prints one JSON object on stdout (and a table on stderr); exit status 1 when
the accuracy check fails.
"""
import argparse
import dataclasses
import json
import math
import os
import platform
import statistics
import sys
import time

import torch
import torch.distributed as dist

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import training  # noqa: E402  (also puts the megamoe package on the path)
import megamoe  # noqa: E402
from common_experts import CommonEPExperts  # noqa: E402
from megamoe import _torch_numerics  # noqa: E402

RTOL, ATOL, REL_L2, REL_MAX = 2e-2, 2e-3, 1e-2, 2e-2  # bench/moe_verify.h
TORCH_ERR_FACTOR = 3  # the scaled norm rule's multiple of torch's error (NormRule)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    training.add_model_arguments(p)
    run = p.add_argument_group("run")
    run.add_argument("--warmup-steps", type=int, default=3)
    run.add_argument("--measured-steps", type=int, default=5)
    run.add_argument("--lr", type=float, default=1e-3)
    run.add_argument("--weight-decay", type=float, default=0.01)
    run.add_argument("--seed", type=int, default=42)
    run.add_argument("--threads", type=int, default=0,
                     help="torch threads per rank (0 = cores / local ranks)")
    run.add_argument("--fp32-reference", action="store_true",
                     help="also run the first step in float32 (A's code) and report how far A "
                          "and B each are from it (rel_l2_vs_fp32 per tensor)")
    run.add_argument("--accuracy-only", action="store_true",
                     help="compare the first step, skip the timed steps")
    run.add_argument("--profile", metavar="DIR",
                     help="write the MegaKernel trace of one extra B step to DIR "
                          "(trace_<rank>.json, timeline.svg)")
    run.add_argument("--output", metavar="FILE", help="also write the JSON to FILE (rank 0)")
    a = p.parse_args(argv)
    if a.warmup_steps < 0 or a.measured_steps < 1:
        p.error("--warmup-steps must be >= 0 and --measured-steps >= 1")
    return a


def build_models(cfg, seed):
    """B (MegaMoeExperts) from the seed, then A with B's weights (checked equal later)."""
    mega = training.build_model(cfg, "mega_moe", seed)
    common = training.build_model(cfg, "common", seed)
    training.copy_weights_from_mega(common, mega)
    return common, mega


def canonical(model, value):
    """name -> value(parameter) for every parameter (value: the parameter, its local gradient,
    its fp32 master); routed experts in the MegaMoeExperts layout."""
    out = {}
    expert_ids = {id(p) for p in model.expert_parameters()}
    for name, p in model.named_parameters():
        if id(p) not in expert_ids:
            out[name] = value(p)
    for i, layer in enumerate(model.layers):
        ex = layer.mlp.experts
        if isinstance(ex, CommonEPExperts):
            gu, dn = ex.to_mega_layout(value(ex.w13), value(ex.w2))
        else:
            gu, dn = value(ex.gate_up_weight).detach(), value(ex.down_weight).detach()
        out[f"layers.{i}.mlp.experts.gate_up_weight"] = gu
        out[f"layers.{i}.mlp.experts.down_weight"] = dn
    return out


def _param(p):
    return p.detach()


def _grad(p):
    # torch autograd leaves no gradient on experts that got no token; MegaMoeExperts writes 0
    return torch.zeros_like(p) if p.grad is None else p.grad.detach().clone()


def _master_of(opt):
    masters = {id(p): m for p, m in zip(opt.params, opt.masters)}
    return lambda p: masters[id(p)]


class RoutingOverride:
    """Makes B route its first step like A did: discrete top-k choices must not decide an
    implementation comparison (a near-tie that bf16 rounding breaks differently would move a
    token to another expert). A's choices are recorded, B's router weights are recomputed from
    B's own logits at A's choices, and the tokens whose own top-k differed are counted."""

    def __init__(self):
        self.ids, self.differing, self.handles = [], [], []

    def record(self, model):
        for layer in model.layers:
            self.handles.append(layer.mlp.gate.register_forward_hook(
                lambda mod, inp, out: self.ids.append(out[1].clone())))

    def force(self, model):
        for i, layer in enumerate(model.layers):
            self.handles.append(layer.mlp.gate.register_forward_hook(
                lambda mod, inp, out, i=i: self._force(mod, inp, out, i)))

    def _force(self, router, inputs, out, layer):
        ids = self.ids[layer]
        own = out[1]
        self.differing.append(int((own.sort(-1).values != ids.sort(-1).values).any(-1).sum()))
        return router.weights_for(router.logits(inputs[0]), ids), ids

    def remove(self):
        for h in self.handles:
            h.remove()
        self.handles = []


class NormRule:
    """The "norm" rule (logits, gradients) on this CPU. Its 1 % / 2 % bounds assume torch's bf16
    matmuls accumulate in fp32 (AVX-512); torch 1.13 below AVX-512 accumulates them in bf16, and
    then every torch matmul of A and B (attention and MLPs too, which megamoe never computes)
    carries an error of err ~ 1.2e-3 sqrt(k), k its contraction length, and A and B differ by a
    few err. There, with the fp32 model, B passes when it is no farther from fp32 than A plus
    1 % (relative L2); without it, A against B with the bounds raised to TORCH_ERR_FACTOR err
    (twice that for max |err|), err measured at the model's longest contraction (a Zen 3 showed
    up to 2.1 err in relative L2 and 3.6 err in max |err| at 1-4 layers, k 256-1024). Every
    rank takes the largest rank's measurement."""

    def __init__(self, cfg, with_fp32):
        self.k = max(cfg.hidden_size, cfg.intermediate_size, cfg.shared_expert_intermediate_size,
                     cfg.vocab_size, cfg.local_num_tokens)
        t = torch.tensor([float(_torch_numerics.torch_bf16_accumulates_in_bf16()),
                          _torch_numerics.bf16_matmul_error(self.k)], dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        self.inexact, self.err = bool(t[0]), t[1].item()
        self.vs_fp32 = self.inexact and with_fp32
        f = max(1.0, TORCH_ERR_FACTOR * self.err / REL_L2) if self.inexact and not with_fp32 else 1
        self.rel_l2, self.rel_max = REL_L2 * f, REL_MAX * f

    def passed(self, rel_l2, rel_max, vs_fp32):
        if self.vs_fp32:
            return vs_fp32["mega_moe"] <= vs_fp32["common"] + REL_L2
        return rel_l2 <= self.rel_l2 and rel_max <= self.rel_max

    def text(self):
        if self.vs_fp32:
            return f"relative L2 from the fp32 model: B's <= A's + {REL_L2} (logits, gradients)"
        return (f"relative L2 <= {self.rel_l2:.3g} and max |err| <= {self.rel_max:.3g} * max |A| "
                "(logits, gradients)")

    def report(self):
        return {"accumulates_in_bf16": self.inexact, "rel_err": self.err, "k": self.k,
                "norm_rule": "vs fp32" if self.vs_fp32 else "scaled" if self.inexact
                else "1 %"}


def compare(name, got, want, rule, fp32=None):
    """This rank's numbers for B (got) against A (want), and of both against the fp32 model
    when given; the verdict comes after reduce_results has summed them over the ranks."""
    g, w = got.detach().float().reshape(-1), want.detach().float().reshape(-1)
    if g.shape != w.shape:
        raise RuntimeError(f"{name}: {g.numel()} elements (B) vs {w.numel()} (A)")
    err = (g - w).abs()
    bound = RTOL * w.abs() + ATOL * max(1.0, w.abs().max().item() if w.numel() else 0.0)
    stats = [float(not torch.isfinite(g).all()), float((err > bound).sum()), float(w.numel()),
             err.pow(2).sum().item(), w.pow(2).sum().item(),
             err.max().item() if w.numel() else 0.0, w.abs().max().item() if w.numel() else 0.0,
             (err / bound).max().item() if w.numel() else 0.0]
    if fp32 is not None:
        f = fp32.detach().float().reshape(-1)
        stats += [(w - f).pow(2).sum().item(), (g - f).pow(2).sum().item(), f.pow(2).sum().item()]
    return {"name": name, "rule": rule, "stats": stats}


_SUMMED = [1, 2, 3, 4, 8, 9, 10]  # stats summed over the ranks (the others: max)


def reduce_results(rows, norm):
    """Sum / max each tensor's numbers over the ranks (dense tensors are replicas, expert
    tensors shards: together, the whole model) and apply the tensor's rule (norm: NormRule)."""
    width = max(len(r["stats"]) for r in rows)
    t = torch.tensor([r["stats"] + [0.0] * (width - len(r["stats"])) for r in rows],
                     dtype=torch.float64)
    cols = [c for c in _SUMMED if c < width]
    sums = t[:, cols].clone()
    dist.all_reduce(sums)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    t[:, cols] = sums
    out = []
    for r, v in zip(rows, t.tolist()):
        rel_l2 = math.sqrt(v[3] / v[4]) if v[4] > 0 else math.sqrt(v[3])
        rel_max = v[5] / v[6] if v[6] > 0 else v[5]
        vs32 = None
        if len(r["stats"]) > 8:
            vs32 = {k: math.sqrt(v[c] / v[10]) if v[10] > 0 else 0.0
                    for k, c in (("common", 8), ("mega_moe", 9))}
        ok = v[1] == 0 if r["rule"] == "elementwise" else norm.passed(rel_l2, rel_max, vs32)
        row = {"name": r["name"], "rule": r["rule"], "passed": v[0] == 0 and ok,
               "elements_outside_elementwise_bound": int(v[1]),
               "max_err_over_elementwise_bound": v[7], "rel_l2": rel_l2, "max_abs_err": v[5],
               "max_err_over_max_ref": rel_max}
        if vs32 is not None:
            row["rel_l2_vs_fp32"] = vs32
        out.append(row)
    return out


def first_step_accuracy(models, opts, batch, world, norm):
    """One optimizer step of A, then (with A's routing) of the fp32 model when there is one,
    then of B; compare on every rank."""
    common, mega = models["common"], models["mega_moe"]
    init_c, init_m = canonical(common, _param), canonical(mega, _param)
    same = torch.tensor(float(all(torch.equal(init_c[k], init_m[k]) for k in init_m)))
    dist.all_reduce(same, op=dist.ReduceOp.MIN)
    del init_c, init_m
    routing = RoutingOverride()
    res = {}
    for key in ("common", "fp32", "mega_moe"):
        if key not in models:
            continue
        (routing.record if key == "common" else routing.force)(models[key])
        opts[key].zero_grad()
        loss, logits = training.forward_backward(models[key], *batch, world)
        grads = canonical(models[key], _grad)
        opts[key].step()
        routing.remove()
        params = canonical(models[key], _master_of(opts[key]))
        res[key] = {"loss": loss, "logits": logits, **{"grad." + k: v for k, v in grads.items()},
                    **{"param." + k: v for k, v in params.items()}}
        if key == "fp32":
            routing.differing.clear()  # count B's own choices only
    c, m, f = res["common"], res["mega_moe"], res.get("fp32")
    rows = [compare(k, m[k], c[k], "norm" if k == "logits" or k.startswith("grad.")
                    else "elementwise", None if f is None else f[k]) for k in m]
    rows = reduce_results(rows, norm)
    rows.insert(0, {"name": "initial parameters", "rule": "bitwise", "passed": bool(same)})
    flips = torch.tensor(routing.differing, dtype=torch.int64)
    dist.all_reduce(flips)
    for i, n in enumerate(flips.tolist()):
        rows.append({"name": f"routing.layers.{i}", "rule": "B routed like A (count only)",
                     "passed": True, "tokens_whose_own_top_k_differed": n})
    return all(r["passed"] for r in rows), rows


def timed_step(model, opt, timer, batch, world):
    dist.barrier()
    timer.reset()
    t0 = time.perf_counter()
    training.optimizer_step(model, opt, *batch, world)
    step_s = time.perf_counter() - t0
    t = torch.tensor([step_s, timer.total_s, timer.forward_s, timer.backward_s],
                     dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)  # the job is as fast as its slowest rank
    return [x * 1e3 for x in t.tolist()]


def measure(models, opts, batch, world, a):
    timers = {k: training.ExpertsTimer(m) for k, m in models.items()}
    samples = {k: [] for k in models}
    for i in range(a.warmup_steps + a.measured_steps):
        for key in ("common", "mega_moe"):
            ms = timed_step(models[key], opts[key], timers[key], batch, world)
            if i >= a.warmup_steps:
                samples[key].append(ms)
    for t in timers.values():
        t.remove()
    return {k: {name: statistics.median(s[j] for s in v)
                for j, name in enumerate(("step", "moe", "moe_fwd", "moe_bwd"))}
            | {"step_min": min(s[0] for s in v), "step_max": max(s[0] for s in v)}
            for k, v in samples.items()}


def profile_one_step(model, opt, batch, world, directory, rank):
    with megamoe.profiler.mega_kernel_profile(dir=directory):  # the block is the window
        training.optimizer_step(model, opt, *batch, world)
    dist.barrier()
    if rank == 0:
        svg = os.path.join(directory, "timeline.svg")
        megamoe.profiler.render_svg(directory, svg)
        print(f"benchmark: MegaKernel trace of one B step in {directory}/trace_<rank>.json, "
              f"{svg} (`megamoe trace summary {directory}`)", file=sys.stderr)


def main(argv=None):
    a = parse_args(argv)
    rank, world, threads = training.init_distributed(
        a.threads, tune_malloc=not a.malloc_defaults)
    cfg = training.config_from_args(a, world)
    models = {}
    try:
        common, mega = build_models(cfg, a.seed)
        models = {"common": common, "mega_moe": mega}
        if a.fp32_reference:
            models["fp32"] = training.build_model(cfg, "common", a.seed)
            training.copy_weights_from_mega(models["fp32"], mega)
            models["fp32"].float()
        opts = {k: training.MasterWeightAdamW(m, lr=a.lr, weight_decay=a.weight_decay)
                for k, m in models.items()}
        g = torch.Generator().manual_seed(a.seed + 10_000 + rank)
        ids = torch.randint(0, cfg.vocab_size, (cfg.batch_size, cfg.seq_len), generator=g)
        batch = (ids, ids.clone())
        norm = NormRule(cfg, "fp32" in models)
        passed, rows = first_step_accuracy(models, opts, batch, world, norm)
        if "fp32" in models:  # only for the first step
            models.pop("fp32").close()
            opts.pop("fp32")
        timing = None
        if passed and not a.accuracy_only:
            timing = measure(models, opts, batch, world, a)
        if passed and a.profile:
            profile_one_step(mega, opts["mega_moe"], batch, world, a.profile, rank)
        info = mega.layers[0].mlp.experts.info()
        experts_info = {k: info[k] for k in (
            "schedule", "workers", "cube_workers", "vector_workers", "dispatch_mode",
            "capacity_policy", "capacity", "max_capacity", "growth_events") if k in info}
        result = report(a, cfg, world, threads, passed, rows, timing, experts_info, norm)
        if rank == 0:
            if norm.inexact:  # before the JSON line (the last one)
                print(f"benchmark: torch's bf16 matmul accumulates in bf16 on this CPU (relative "
                      f"error {norm.err:.3g} at k = {norm.k}; ~0 with fp32 accumulation, as with "
                      f"AVX-512), so the 1 % rule for the logits and gradients does not hold for "
                      f"A; they are judged by: {norm.text()}" + ("" if norm.vs_fp32 else
                      f" ({TORCH_ERR_FACTOR} x that error; --fp32-reference: B no farther from "
                      f"the fp32 model than A + {REL_L2})"), flush=True)
            text = json.dumps(result)
            print(text, flush=True)
            if a.output:
                with open(a.output, "w") as f:
                    f.write(text + "\n")
            print_table(passed, rows, timing)
        return 0 if passed else 1
    finally:
        for m in models.values():
            m.close()
        dist.barrier()
        dist.destroy_process_group()


def report(a, cfg, world, threads, passed, rows, timing, experts_info, norm):
    def pair(key):
        return None if timing is None else {k: timing[k][key] for k in ("common", "mega_moe")}

    def ratio(d):
        return None if d is None else d["common"] / d["mega_moe"]

    step, moe = pair("step"), pair("moe")
    config = dict(dataclasses.asdict(cfg), local_num_tokens=cfg.local_num_tokens, world_size=world,
                  threads_per_rank=threads, warmup_steps=a.warmup_steps,
                  measured_steps=a.measured_steps, lr=a.lr, weight_decay=a.weight_decay,
                  seed=a.seed, optimizer="AdamW, fp32 master weights", dtype="bfloat16",
                  malloc="keeps freed memory" if training.malloc_keeps_freed_memory
                  else "glibc defaults",
                  mega_moe_experts=experts_info,
                  accuracy_rule={
                      "elementwise": f"every element within rtol {RTOL} * |A| + atol {ATOL} * "
                                     "max(1, max |A|) (loss, parameters after the step)",
                      "norm": norm.text(),
                      "all": "finite; B routes its first step like A"})
    return {
        "config": config,
        "accuracy": {"passed": passed, "tensors": rows, "torch_bf16_matmul": norm.report()},
        "median_step_ms": step,
        "speedup": ratio(step),
        "moe_ms": moe,
        "moe_speedup": ratio(moe),
        "moe_share": None if timing is None else {k: moe[k] / step[k] for k in step},
        "versions": {"megamoe": megamoe.__version__, "torch": torch.__version__,
                     "python": platform.python_version(), "library": megamoe.library_path},
    }


def print_table(passed, rows, timing):
    tensors = [r for r in rows if "rel_l2" in r]
    flips = [r["tokens_whose_own_top_k_differed"] for r in rows
             if "tokens_whose_own_top_k_differed" in r]
    worst_l2 = max(tensors, key=lambda r: r["rel_l2"])
    elem = [r for r in tensors if r["rule"] == "elementwise"]
    worst_el = max(elem, key=lambda r: r["max_err_over_elementwise_bound"])
    print(f"accuracy: {'passed' if passed else 'FAILED'} ({len(tensors)} tensors); largest rel "
          f"L2 {worst_l2['rel_l2']:.2e} ({worst_l2['name']}); elementwise: worst "
          f"{worst_el['max_err_over_elementwise_bound']:.3f} of the bound "
          f"({worst_el['name']}); tokens whose own top-k differed from A's, per layer: "
          f"{flips}", file=sys.stderr)
    vs32 = [r for r in tensors if "rel_l2_vs_fp32" in r]
    if vs32:
        worst = {k: max(vs32, key=lambda r: r["rel_l2_vs_fp32"][k]) for k in ("common", "mega_moe")}
        print("against the fp32 model, largest rel L2: " + ", ".join(
            f"{k} {w['rel_l2_vs_fp32'][k]:.2e} ({w['name']})" for k, w in worst.items()),
            file=sys.stderr)
    for r in rows:
        if not r["passed"]:
            print(f"  FAIL {r['name']} ({r['rule']}): " + ", ".join(
                f"{k} {v:.3g}" for k, v in r.items() if isinstance(v, (int, float))
                and not isinstance(v, bool)), file=sys.stderr)
    if timing:
        print(f"{'':10} {'step ms':>9} {'min':>9} {'max':>9} {'experts ms':>11} {'fwd':>8} "
              f"{'bwd':>8} {'share':>6}", file=sys.stderr)
        for k, t in timing.items():
            print(f"{k:10} {t['step']:9.1f} {t['step_min']:9.1f} {t['step_max']:9.1f} "
                  f"{t['moe']:11.1f} {t['moe_fwd']:8.1f} {t['moe_bwd']:8.1f} "
                  f"{t['moe'] / t['step']:6.1%}", file=sys.stderr)
        c, m = timing["common"], timing["mega_moe"]
        print(f"speedup: step {c['step'] / m['step']:.2f}x, routed experts "
              f"{c['moe'] / m['moe']:.2f}x", file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
