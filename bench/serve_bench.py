"""One rank of `megamoe bench serve` (bench/bench_serve.c starts the ranks with `megamoe launch`).

For every (shape, quantisation, tokens per rank) it times the fused `mega_moe` call and the
unfused path a CPU user would write today — megamoe's DispatchV2 -> per-expert torch matmuls and
SwiGLU -> CombineV2 — on the same weights, tokens and routing, every (quantisation,
implementation) interleaved iteration by iteration. Per row: the median over iterations of the
slowest rank's time, the physical floor (floor_parts: the expert weights the ranks touch at the
read bandwidth the machine gives them, or the busiest rank's arithmetic at the probed peak,
whichever is larger, plus the dispatch and combine copies) and, for prefill, the share of the
job's BF16 peak. Rank 0 writes the rows as JSON lines to --out.

Shapes: name:H:I:E:K. Quantisations: bf16 (A16W16), w8a8 (int8 per-channel weights, per-token
int8 activations), w4a8 (int4 per-channel weights packed two per int8 with the canonical bias).
"""
import argparse
import json
import math
import mmap
import os
import resource
import statistics
import sys
import time

import numpy as np
import torch
import torch.distributed as dist

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "python"))
import megamoe.comm as mcomm  # noqa: E402
import megamoe.ops as ops  # noqa: E402
from megamoe import _torch_numerics  # noqa: E402
from megamoe import serve_reference as R  # noqa: E402


def parse():
    p = argparse.ArgumentParser()
    p.add_argument("--shape", required=True)           # name:H:I:E:K
    p.add_argument("--tokens", default="1,8,32,128")
    p.add_argument("--quant", default="bf16,w8a8,w4a8")
    p.add_argument("--impl", default="mega_moe,unfused")
    p.add_argument("--iters", type=int, default=5)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--read-gbs", type=float, default=0.0)   # per core, all cores streaming
    p.add_argument("--copy-gbs", type=float, default=0.0)   # per core, bytes copied per second
    p.add_argument("--peak-gflops", type=float, default=0.0)  # BF16 peak per core
    p.add_argument("--read-one-gbs", type=float, default=0.0)  # one core reading alone
    p.add_argument("--streams", type=int, default=1)  # cores the --read-gbs probe ran on
    p.add_argument("--peak-int8-gops", type=float, default=0.0)  # INT8 peak per core
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--no-probe", action="store_true")
    # 4 ranks on 2 hosts: one host and two, call by call (bench/serve_bench_paired.py)
    p.add_argument("--paired-hosts", action="store_true")  # floors from the run-start probe only
    p.add_argument("--hosts", type=int, default=1)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--check", type=int, default=1)
    p.add_argument("--out", required=True)
    # Diagnostic (run the script directly): before every timed mega_moe call, spin:MS busy-waits
    # MS ms in Python (no memory traffic), stream:MB reads an MB-MiB array, fault:MB maps MB MiB
    # fresh, touches every page and unmaps them (page-table churn, as the torch path's large
    # temporaries cause) — what a long call before it does to the fused call, without the
    # other paths' own state
    p.add_argument("--between", default="")
    return p.parse_args()


def between_action(spec):
    """The --between action, or None."""
    if not spec:
        return None
    kind, _, arg = spec.partition(":")
    if kind == "spin":
        ms = float(arg)

        def spin():
            end = time.perf_counter() + ms * 1e-3
            while time.perf_counter() < end:
                pass
        return spin
    if kind == "stream":
        buf = np.ones(int(float(arg) * (1 << 20)) // 8, dtype=np.float64)
        return lambda: float(buf.sum())
    if kind == "fault":
        n = int(float(arg) * (1 << 20))

        def fault():
            m = mmap.mmap(-1, n)  # anonymous: fresh pages at any size (malloc may reuse)
            a = np.frombuffer(m, dtype=np.uint8)
            a[::4096] = 1  # the first touch of every page faults it in
            del a
            m.close()  # munmap: the pages and their mappings go back
        return fault
    raise SystemExit(f"--between {spec}: expected spin:MS, stream:MB or fault:MB")


def expert_weights(H, I, e, seed, quant):
    """Expert e's weights in the operator's layouts (deterministic per expert)."""
    g = torch.Generator().manual_seed(seed * 100003 + e)
    f1 = torch.randn(H, 2 * I, generator=g) / math.sqrt(H)
    f2 = torch.randn(I, H, generator=g) / math.sqrt(I)
    if quant == "bf16":
        return {"l1": f1.to(torch.bfloat16), "l2": f2.to(torch.bfloat16)}
    out = {}
    for k, f in (("1", f1), ("2", f2)):
        if quant == "w8a8":
            sig = f.abs().amax(0) / 127
            out["l" + k] = torch.round(f / sig).clamp(-127, 127).to(torch.int8)
        else:
            sig = f.abs().amax(0) / 7
            v = torch.round(f / sig).clamp(-8, 7)
            out["l" + k] = R.pack_int4(v.numpy(), "int8")
            out["b" + k] = (8 * (v.double() * sig.double()).sum(0)).float()
            out["v" + k] = v.to(torch.int8)
        out["sf" + k] = sig.float()
    return out


def weight_bytes(H, I, quant):
    if quant == "bf16":
        return 6 * H * I
    scales = 4 * (2 * I + H)
    if quant == "w8a8":
        return 3 * H * I + scales
    return 3 * H * I // 2 + 2 * scales  # packed int4 + scales + biases


class Unfused:
    """DispatchV2 -> per-expert torch matmuls + SwiGLU -> CombineV2 (what a CPU user writes)."""

    def __init__(self, W, rank, E, I, experts, quant):
        self.W, self.rank, self.E, self.I, self.quant = W, rank, E, I, quant
        self.group = mcomm.group_name(None)
        self.experts = experts

    def w(self, j, k):
        ex = self.experts[j]
        if self.quant == "bf16":
            return ex["l" + k]
        # dequantise per call (a CPU user has no int8 / int4 grouped GEMM in torch)
        v = ex["l" + k] if self.quant == "w8a8" else ex["v" + k]
        return (v.to(torch.bfloat16) * ex["sf" + k].to(torch.bfloat16))

    def __call__(self, x, ids, wts, mm=torch.matmul):
        q = 2 if self.quant != "bf16" else 0
        outs = ops.npu_moe_distribute_dispatch_v2(x, ids, self.group, self.W, self.rank, self.E,
                                                  quant_mode=q, expert_token_nums_type=1)
        expand_x, scales, assist, counts, ep_recv = outs[0], outs[1], outs[2], outs[3], outs[4]
        rows = int(counts.sum())
        y = torch.empty(expand_x.shape[0], x.shape[1], dtype=torch.bfloat16)
        off = 0
        I = self.I
        for j in range(counts.shape[0]):
            c = int(counts[j])
            if c == 0:
                continue
            xs = expand_x[off:off + c]
            if q:
                xs = (xs.to(torch.float32) * scales[off:off + c, None]).to(torch.bfloat16)
            h = mm(xs, self.w(j, "1"))
            a = torch.nn.functional.silu(h[:, :I]) * h[:, I:]
            y[off:off + c] = mm(a, self.w(j, "2"))
            off += c
        assert off == rows
        return ops.npu_moe_distribute_combine_v2(y, ids, assist, ep_recv, wts, self.group, self.W,
                                                 self.rank, self.E)


class UnfusedGmm:
    """The same path through the companion operators (torch_npu's): DispatchV2 ->
    npu_grouped_matmul_swiglu_quant (int8 x int8/int4 GEMM, dequantised, SwiGLU, re-quantised
    per row) -> npu_grouped_matmul with the per-token scales -> CombineV2 for w8a8 / w4a8;
    npu_grouped_matmul -> npu_swiglu -> npu_grouped_matmul for bf16: what vLLM-Ascend's
    unfused MC2 path does."""

    def __init__(self, W, rank, E, experts, quant):
        self.W, self.rank, self.E, self.quant = W, rank, E, quant
        self.group = mcomm.group_name(None)
        if quant == "bf16":
            self.w13 = torch.stack([e["l1"] for e in experts])
            self.w2 = torch.stack([e["l2"] for e in experts])
            return
        if quant == "w8a8":
            self.w13 = torch.stack([e["l1"] for e in experts])
            self.w2 = torch.stack([e["l2"] for e in experts])
        else:  # int4 in int32 carriers (8 per element), npu_grouped_matmul's W4A8 weight
            self.w13 = torch.stack([R.pack_int4(e["v1"].numpy(), "int32") for e in experts])
            self.w2 = torch.stack([R.pack_int4(e["v2"].numpy(), "int32") for e in experts])
        self.s13 = torch.stack([e["sf1"] for e in experts])
        self.s2 = torch.stack([e["sf2"] for e in experts])
        # A8W4 (the device's formula ((X - 8)(W s) + bias) p): vLLM's w_scale_bias 8 colsum(W s)
        self.b13 = torch.stack([e["b1"] for e in experts]) if quant == "w4a8" else None
        self.b2 = [torch.stack([e["b2"] for e in experts])] if quant == "w4a8" else None

    def __call__(self, x, ids, wts):
        q = self.quant != "bf16"
        (expand_x, scale, assist, group_list, ep_recv, _, _) = ops.npu_moe_distribute_dispatch_v2(
            x, ids, self.group, self.W, self.rank, self.E, quant_mode=2 if q else 0,
            expert_token_nums_type=0)
        if q:
            hs, s, _ = ops.npu_grouped_matmul_swiglu_quant(expand_x, self.w13, group_list,
                                                           self.s13, scale, bias=self.b13)
            hs = ops.npu_grouped_matmul(x=[hs], weight=[self.w2], scale=[self.s2], bias=self.b2,
                                        per_token_scale=[s], split_item=2, group_list_type=0,
                                        group_type=0, group_list=group_list,
                                        output_dtype=torch.bfloat16)[0]
        else:
            hs = ops.npu_grouped_matmul(x=[expand_x], weight=[self.w13], split_item=2,
                                        group_list_type=0, group_type=0,
                                        group_list=group_list)[0]
            hs = ops.npu_swiglu(hs)
            hs = ops.npu_grouped_matmul(x=[hs], weight=[self.w2], split_item=2,
                                        group_list_type=0, group_type=0,
                                        group_list=group_list)[0]
        return ops.npu_moe_distribute_combine_v2(hs, ids, assist, ep_recv, wts, self.group,
                                                 self.W, self.rank, self.E)


def floor_parts(a, quant, gathered, probe=None):
    """The call's floor, in three parts (seconds): the weights, the arithmetic and the copies.
    The weights: the ranks share the memory system (simulated hosts too), so the call takes at
    least the time the machine needs for every rank's expert weights at once (per-core rate x
    the cores the probe streamed on) and at least the time the rank with the most weights needs
    at what one core alone reads (once the others are done it streams alone). The arithmetic:
    the busiest rank's 6HI ops per received row at the probed peak of the unit the quantisation
    runs on (BF16 for bf16, INT8 for w8a8 / w4a8). The call is bound by the larger of the two;
    its dispatch and combine copies come on top (the busiest rank's bytes at the copy rate)."""
    read_gbs, read_one_gbs, streams = a.read_gbs, a.read_one_gbs, a.streams
    if probe:  # taken beside the calls (one thread per rank): preferred to the run-start probe
        read_gbs, read_one_gbs, streams = probe["all"], probe["one"], probe["streams"]
    if not read_gbs:
        return 0.0, 0.0, 0.0
    all_bw = read_gbs * 1e9 * max(1, streams)
    one_bw = min((read_one_gbs or read_gbs) * 1e9 * a.threads, all_bw)
    touched = [gr["touched"] for gr in gathered]
    mem_s = max(max(touched) / one_bw, sum(touched) / all_bw)
    peak = a.peak_gflops if quant == "bf16" else a.peak_int8_gops
    compute_s = max(gr["flops"] for gr in gathered) / (peak * 1e9 * a.threads) if peak else 0.0
    copy_s = max(gr["copy"] for gr in gathered) / (a.copy_gbs * 1e9) if a.copy_gbs else 0.0
    return mem_s, compute_s, copy_s


class ReadProbe:
    """Read bandwidth measured beside the calls, once per iteration: the ranks that run the
    calls stream a private 256 MiB buffer at once (the slowest one's rate per core: what each
    gets while all stream), then the first of them streams alone (what the rank with the most
    weights gets once the others are done). This machine's memory bandwidth drifts by up to 2x
    within minutes, so a probe taken at the start of the run misjudged the floors of calls made
    later. numpy's int64 sum reads at the rate of the C probe; arrays this large get 2 MiB pages
    (numpy asks for them), as the weight caches do. `barrier` is collective over every rank
    (ranks outside `active` only wait)."""

    def __init__(self, barrier, rank, active):
        self.barrier, self.rank, self.active = barrier, rank, list(active)
        self.buf = (np.ones((256 << 20) // 8, dtype=np.int64) if rank in self.active
                    else None)  # written once: pages faulted in
        self.all, self.one = [], []

    def _read(self):
        t0 = time.perf_counter()
        np.add.reduce(self.buf)
        return time.perf_counter() - t0

    def take(self):
        nbytes = 256 << 20
        self.barrier()
        t = self._read() if self.rank in self.active else 0.0
        ts = [None] * dist.get_world_size()
        dist.all_gather_object(ts, t)
        self.all.append(nbytes / max(ts) * 1e-9)
        self.barrier()
        t = self._read() if self.rank == self.active[0] else 0.0
        self.barrier()
        if self.rank == self.active[0]:
            self.one.append(nbytes / t * 1e-9)

    def median(self):
        """Per-core GB/s (all at once, one alone) over the probes taken since the last call,
        then forget them: each token count's rows use the probes of its own calls (`one` is
        known on the first active rank only)."""
        r = {"all": statistics.median(self.all), "one": statistics.median(self.one) if self.one
             else 0.0, "streams": len(self.active)}
        self.all, self.one = [], []
        return r


def add_speedups(rows):
    """The issue's ratios on the fused rows, from the same job: `speedup_vs_bf16` (ms of the
    bf16 call / ms of this quantisation's, same shape and tokens) and `speedup_vs_<impl>` (ms of
    that unfused path of the same quantisation / ms of the fused call)."""
    ms = {(r["impl"], r["quant"], r["shape"], r["tokens"], r["hosts"]): r["ms"] for r in rows}
    for r in rows:
        if r["impl"] != "mega_moe" or not r["ms"]:
            continue
        key = (r["shape"], r["tokens"], r["hosts"])
        if r["quant"] != "bf16" and ("mega_moe", "bf16") + key in ms:
            r["speedup_vs_bf16"] = round(ms[("mega_moe", "bf16") + key] / r["ms"], 3)
        for other in ("unfused", "unfused_gmm"):
            if (other, r["quant"]) + key in ms:
                r["speedup_vs_" + other] = round(ms[(other, r["quant"]) + key] / r["ms"], 3)


def main():
    a = parse()
    if a.paired_hosts:
        if a.between:
            raise SystemExit("--between: one host only (the paired run times its own calls)")
        import serve_bench_paired
        return serve_bench_paired.main(a)
    torch.set_num_threads(max(1, a.threads))
    dist.init_process_group("gloo")
    rank, W = dist.get_rank(), dist.get_world_size()
    world = mcomm.world()
    # torch 1.13 below AVX-512 accumulates bf16 matmuls in bf16 (the unfused path's error then
    # exceeds the 1 % its comparison was made for): there megamoe is also compared with the
    # unfused path's fp32-accumulated form; every rank decides alike (collectives follow)
    inexact = torch.tensor(float(_torch_numerics.torch_bf16_accumulates_in_bf16()))
    dist.all_reduce(inexact, op=dist.ReduceOp.MAX)
    inexact = bool(inexact.item())
    name, H, I, E, K = a.shape.split(":")
    H, I, E, K = int(H), int(I), int(E), int(K)
    L = E // W
    tokens = [int(t) for t in a.tokens.split(",")]
    impls = a.impl.split(",")
    nmax = max(tokens)
    buf = ops.get_symm_buffer_for_mega_moe(None, E, nmax, K, H, 2 * I)
    rows_out = []
    # Every quantisation's weights at once, and their calls interleaved iteration by iteration
    # with the implementations: speedup_vs_bf16 compares calls made side by side (this
    # machine's memory bandwidth drifts by up to 2x within minutes; rows measured one
    # quantisation after the other compared the drift as much as the kernels).
    variants = []
    for quant in a.quant.split(","):
        experts = [expert_weights(H, I, rank * L + j, a.seed, quant) for j in range(L)]
        kw = {}
        if quant != "bf16":
            kw = {"l1_weights_sf": [torch.stack([e["sf1"] for e in experts])],
                  "l2_weights_sf": [torch.stack([e["sf2"] for e in experts])]}
            if quant == "w4a8":
                kw.update(l1_bias=[e["b1"] for e in experts], l2_bias=[e["b2"] for e in experts],
                          weight1_type=285, weight2_type=285)
        variants.append({
            "quant": quant, "kw": kw,
            "w1": [e["l1"] for e in experts], "w2": [e["l2"] for e in experts],
            "unfused": Unfused(W, rank, E, I, experts, quant),
            "gmm": UnfusedGmm(W, rank, E, experts, quant) if "unfused_gmm" in impls else None})

    def use(v):  # the buffer's dispatch quantisation follows the weights
        if v["quant"] != "bf16":
            buf.dispatch_quant_mode, buf.dispatch_quant_out_dtype = 2, torch.int8
        else:
            buf.dispatch_quant_mode, buf.dispatch_quant_out_dtype = 0, None

    # one thread per rank: the probe beside the calls measures what those threads read
    probe = ReadProbe(world.barrier, rank, range(W)) if a.threads == 1 and not a.no_probe else None
    between = between_action(a.between)
    for n in tokens:
        g = torch.Generator().manual_seed(a.seed * 7 + rank * 1000 + n)
        x = (torch.randn(n, H, generator=g)).to(torch.bfloat16)
        ids = torch.stack([torch.randperm(E, generator=g)[:K] for _ in range(n)]).int()
        wts = torch.softmax(torch.randn(n, K, generator=g), -1)
        runs = {}
        for v in variants:
            q = v["quant"]
            runs[(q, "mega_moe")] = (lambda v=v: ops.mega_moe(x, ids, wts, v["w1"], v["w2"], buf,
                                                               **v["kw"])[0])
            runs[(q, "unfused")] = (lambda v=v: v["unfused"](x, ids, wts))
            runs[(q, "unfused_gmm")] = (lambda v=v: v["gmm"](x, ids, wts))
        keys = [(v["quant"], i) for v in variants for i in impls]
        times = {k: [] for k in keys}
        cpus = {k: [] for k in keys}
        syss = {k: [] for k in keys}  # kernel time and minor page faults per call (every
        faults = {k: [] for k in keys}  # thread): what a call pays the kernel, e.g. for memory
        outs = {}
        for it in range(a.warmup + a.iters):
            for v in variants:  # interleaved, iteration by iteration
                use(v)
                for impl in impls:
                    k = (v["quant"], impl)
                    if between and impl == "mega_moe":
                        between()
                    world.barrier()
                    u0 = resource.getrusage(resource.RUSAGE_SELF)
                    c0 = time.process_time()
                    t0 = time.perf_counter()
                    outs[k] = runs[k]()
                    dt = time.perf_counter() - t0
                    if it >= a.warmup:
                        u1 = resource.getrusage(resource.RUSAGE_SELF)
                        times[k].append(dt)
                        cpus[k].append(time.process_time() - c0)
                        syss[k].append(u1.ru_stime - u0.ru_stime)
                        faults[k].append(u1.ru_minflt - u0.ru_minflt)
            if probe and it >= a.warmup:
                probe.take()
        beside = probe.median() if probe else None
        for v in variants:
            quant = v["quant"]
            use(v)
            _, etn = ops.mega_moe(x, ids, wts, v["w1"], v["w2"], buf, **v["kw"])
            touched = int((etn > 0).sum()) * weight_bytes(H, I, quant)
            recv = int(etn.sum())
            row = 2 * H if quant == "bf16" else H + 4
            # dispatch: sent n*K rows + received recv rows; combine: recv results written,
            # n*K rows read back
            copy = (n * K + recv) * row + (recv + n * K) * 2 * H
            # what crosses hosts for this rank: its rows to owners on other hosts and their
            # results back (receive rows of row_bytes each way)
            rb = -(-max(2 * H, -(-H // 8) * 8 + 8 + -(-H // 32)) // 64) * 64
            host_of = [r * a.hosts // W for r in range(W)]
            remote_pairs = int(sum(1 for e in ids.flatten().tolist()
                                   if host_of[e // L] != host_of[rank]))
            wire_bytes = 2 * remote_pairs * rb
            flops = recv * 6 * H * I
            gathered = [None] * W
            dist.all_gather_object(gathered, {"times": {i: times[(quant, i)] for i in impls},
                                              "cpus": {i: cpus[(quant, i)] for i in impls},
                                              "syss": {i: syss[(quant, i)] for i in impls},
                                              "faults": {i: faults[(quant, i)] for i in impls},
                                              "touched": touched, "copy": copy, "flops": flops,
                                              "wire_bytes": wire_bytes})
            diff = {}
            if a.check and "mega_moe" in impls and n:
                got = outs[(quant, "mega_moe")]
                for other in ("unfused", "unfused_gmm"):
                    if other in impls:
                        diff[other] = R.rel_l2(got, outs[(quant, other)])
                if inexact and "unfused" in impls:
                    ref = v["unfused"](x, ids, wts, mm=_torch_numerics.matmul_fp32_acc)
                    diff["unfused_fp32acc"] = R.rel_l2(got, ref)
                    diff["unfused_self"] = R.rel_l2(outs[(quant, "unfused")], ref)
            diffs = [None] * W
            dist.all_gather_object(diffs, diff)
            if rank == 0:
                mem_s, compute_s, copy_s = floor_parts(a, quant, gathered, beside)
                floor_ms = 1e3 * (max(mem_s, compute_s) + copy_s)
                job_flops = sum(gr["flops"] for gr in gathered)
                for impl in impls:
                    per_iter = [max(gr["times"][impl][i] for gr in gathered)
                                for i in range(a.iters)]
                    ms = 1e3 * statistics.median(per_iter)
                    # CPU time of the process per call (every thread; waits that spin count):
                    # a figure that a loaded machine disturbs less than ms
                    cpu = 1e3 * statistics.median([max(gr["cpus"][impl][i] for gr in gathered)
                                                   for i in range(a.iters)])
                    sys_ms = 1e3 * statistics.median([max(gr["syss"][impl][i] for gr in gathered)
                                                      for i in range(a.iters)])
                    minflt = statistics.median([max(gr["faults"][impl][i] for gr in gathered)
                                                for i in range(a.iters)])
                    r = {"impl": impl, "quant": quant, "shape": name, "tokens": n,
                         "hosts": a.hosts, "ranks": W, "H": H, "I": I, "E": E, "K": K,
                         "ms": round(ms, 4), "floor_ms": round(floor_ms, 4),
                         "floor_mem_ms": round(1e3 * mem_s, 4),
                         "floor_compute_ms": round(1e3 * compute_s, 4),
                         "read_gbs_beside": round(beside["all"], 2) if beside else None,
                         "read_one_gbs_beside": round(beside["one"], 2) if beside else None,
                         "over_floor": round(ms / floor_ms, 3) if floor_ms > 0 else None,
                         "cpu_ms": round(cpu, 4), "sys_ms": round(sys_ms, 3),
                         "minflt": int(minflt)}
                    if a.hosts > 1:
                        r["bytes_to_other_hosts"] = max(gr["wire_bytes"] for gr in gathered)
                    if n >= 1024 and a.peak_gflops:
                        r["pct_peak"] = round(100 * job_flops / (ms * 1e-3) /
                                              (a.peak_gflops * 1e9 * W * a.threads), 2)
                    if impl == "mega_moe":
                        for other in ("unfused", "unfused_gmm", "unfused_fp32acc"):
                            ds = [d[other] for d in diffs if other in d]
                            if ds:
                                r["vs_" + other + "_rel_l2"] = round(max(ds), 5)
                        if "unfused" in impls and a.check:  # 0 / 1: bench_serve.c's row
                            r["torch_bf16_accumulates_in_bf16"] = int(inexact)  # parser: no bools
                        ds = [d["unfused_self"] for d in diffs if "unfused_self" in d]
                        if ds:  # torch's own error: how far its bf16 path is from that form
                            r["unfused_vs_fp32acc_rel_l2"] = round(max(ds), 5)
                    rows_out.append(r)
                    print(json.dumps(r), flush=True)
    buf.destroy()
    if rank == 0:
        add_speedups(rows_out)
        with open(a.out, "w") as f:
            for r in rows_out:
                f.write(json.dumps(r) + "\n")
    mcomm.shutdown()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
