"""`megamoe bench serve --hosts 2`: the fused call on one host and across two, call by call.

The wire's share of a decode call is a fraction of a millisecond on a call of 5-60 ms, and this
machine's memory bandwidth — which sets the call's time — drifts by up to 2x within minutes, so
the one-host twin run as a separate job before the two-host job compared the drift, not the wire
(over_wire_floor came out between -27 and +16). Here one job of 4 ranks on 2 simulated hosts
(ranks 0, 1 on host 0; 2, 3 on host 1) holds two EP groups of 2 with the same experts per member:
`one` = {0, 1} (one host, shared memory) and `two` = {0, 2} (one rank per host, UCX between
them). Every iteration calls each group in turn with the same weights, tokens and routing per
member; the ranks outside the called group wait in a gloo barrier (asleep, off the cores), so
each call has the machine's two cores to itself, as a job of 2 ranks has. Rows: hosts 1 (group
`one`) and hosts 2 (group `two`, with bytes_to_other_hosts and extra_ms: the median over the
iterations of the two-host call minus its one-host twin, with quartiles extra_ms_q1/q3); the C
driver adds ms_one_host, wire_floor_ms and over_wire_floor = extra_ms / wire_floor_ms.
"""
import json
import statistics
import time

import torch
import torch.distributed as dist

import serve_bench as S  # first: it puts the repository's python/ on the path

import megamoe.comm as mcomm  # noqa: E402
import megamoe.ops as ops  # noqa: E402

GROUPS = {"one": [0, 1], "two": [0, 2]}  # global ranks; member index = expert block


def main(a):
    torch.set_num_threads(max(1, a.threads))
    dist.init_process_group("gloo")
    mcomm.world()
    rank, W = dist.get_rank(), dist.get_world_size()
    if W != 4 or a.hosts != 2:
        raise SystemExit("serve_bench --paired-hosts runs 4 ranks on 2 hosts")
    name, H, I, E, K = a.shape.split(":")
    H, I, E, K = int(H), int(I), int(E), int(K)
    L = E // 2
    tokens = [int(t) for t in a.tokens.split(",")]
    nmax = max(tokens)
    pgs = {g: dist.new_group(m) for g, m in GROUPS.items()}  # every rank creates every group
    mine = {g: m.index(rank) for g, m in GROUPS.items() if rank in m}
    comms = {g: mcomm.for_group(pgs[g]) for g in mine}
    member = next(iter(mine.values()), None)  # rank 0 is member 0 of both: one set of weights
    bufs = {g: ops.get_symm_buffer_for_mega_moe(pgs[g], E, nmax, K, H, 2 * I) for g in mine}
    variants = []
    for quant in a.quant.split(","):
        kw, w1, w2 = {}, [], []
        if member is not None:
            experts = [S.expert_weights(H, I, member * L + j, a.seed, quant) for j in range(L)]
            w1, w2 = [e["l1"] for e in experts], [e["l2"] for e in experts]
            if quant != "bf16":
                kw = {"l1_weights_sf": [torch.stack([e["sf1"] for e in experts])],
                      "l2_weights_sf": [torch.stack([e["sf2"] for e in experts])]}
                if quant == "w4a8":
                    kw.update(l1_bias=[e["b1"] for e in experts],
                              l2_bias=[e["b2"] for e in experts], weight1_type=285,
                              weight2_type=285)
        variants.append({"quant": quant, "kw": kw, "w1": w1, "w2": w2})

    def use(buf, v):
        if v["quant"] != "bf16":
            buf.dispatch_quant_mode, buf.dispatch_quant_out_dtype = 2, torch.int8
        else:
            buf.dispatch_quant_mode, buf.dispatch_quant_out_dtype = 0, None

    probe = S.ReadProbe(dist.barrier, rank, GROUPS["one"]) if not a.no_probe else None
    rows_out = []
    for n in tokens:
        if member is not None:  # seeded by member index: the same calls in both groups
            g = torch.Generator().manual_seed(a.seed * 7 + member * 1000 + n)
            x = torch.randn(n, H, generator=g).to(torch.bfloat16)
            ids = torch.stack([torch.randperm(E, generator=g)[:K] for _ in range(n)]).int()
            wts = torch.softmax(torch.randn(n, K, generator=g), -1)
        times = {(v["quant"], grp): [] for v in variants for grp in GROUPS}
        for it in range(a.warmup + a.iters):
            for v in variants:
                for grp in GROUPS:  # one host, then two: side by side, call by call
                    dist.barrier()  # every rank; the others sleep here through the call
                    if grp in mine:
                        buf = bufs[grp]
                        use(buf, v)
                        # megamoe's barrier, as the one-job path times its calls: it waits
                        # awake (a call right after a sleeping wait paid ~0.5 ms to wake)
                        comms[grp].barrier()
                        t0 = time.perf_counter()
                        ops.mega_moe(x, ids, wts, v["w1"], v["w2"], buf, **v["kw"])
                        if it >= a.warmup:
                            times[(v["quant"], grp)].append(time.perf_counter() - t0)
            if probe and it >= a.warmup:
                probe.take()
        beside = probe.median() if probe else None
        for v in variants:
            quant = v["quant"]
            info = {}
            for grp in mine:
                use(bufs[grp], v)
                _, etn = ops.mega_moe(x, ids, wts, v["w1"], v["w2"], bufs[grp], **v["kw"])
                recv = int(etn.sum())
                row = 2 * H if quant == "bf16" else H + 4
                rb = -(-max(2 * H, -(-H // 8) * 8 + 8 + -(-H // 32)) // 64) * 64
                # group `two`: member m is on host m, so every row to the other member crosses
                remote = int(sum(1 for e in ids.flatten().tolist() if e // L != mine[grp]))
                info[grp] = {"times": times[(quant, grp)],
                             "touched": int((etn > 0).sum()) * S.weight_bytes(H, I, quant),
                             "copy": (n * K + recv) * row + (recv + n * K) * 2 * H,
                             "flops": recv * 6 * H * I,
                             "wire_bytes": 2 * remote * rb if grp == "two" else 0}
            gathered = [None] * W
            dist.all_gather_object(gathered, info)
            if rank != 0:
                continue
            per_group = {}
            for grp, hosts in (("one", 1), ("two", 2)):
                parts = [gr[grp] for gr in gathered if grp in gr]
                mem_s, compute_s, copy_s = S.floor_parts(a, quant, parts, beside)
                floor_ms = 1e3 * (max(mem_s, compute_s) + copy_s)
                per_iter = [max(p["times"][i] for p in parts) for i in range(a.iters)]
                per_group[grp] = per_iter
                ms = 1e3 * statistics.median(per_iter)
                r = {"impl": "mega_moe", "quant": quant, "shape": name, "tokens": n,
                     "hosts": hosts, "ranks": 2, "H": H, "I": I, "E": E, "K": K,
                     "ms": round(ms, 4), "floor_ms": round(floor_ms, 4),
                     "floor_mem_ms": round(1e3 * mem_s, 4),
                     "floor_compute_ms": round(1e3 * compute_s, 4),
                     "read_gbs_beside": round(beside["all"], 2) if beside else None,
                     "read_one_gbs_beside": round(beside["one"], 2) if beside else None,
                     "over_floor": round(ms / floor_ms, 3) if floor_ms > 0 else None}
                if hosts > 1:
                    r["bytes_to_other_hosts"] = max(p["wire_bytes"] for p in parts)
                    # the paired estimate of the time the wire adds: per iteration, this call
                    # minus its one-host twin made just before (the same drift in both), median
                    # and quartiles; the C driver divides it by the wire floor
                    d = sorted(1e3 * (t - o) for t, o in zip(per_iter, per_group["one"]))
                    q = statistics.quantiles(d, n=4) if len(d) > 1 else [d[0]] * 3
                    r["extra_ms"] = round(statistics.median(d), 4)
                    r["extra_ms_q1"], r["extra_ms_q3"] = round(q[0], 4), round(q[2], 4)
                rows_out.append(r)
                print(json.dumps(r), flush=True)
    for buf in bufs.values():
        buf.destroy()
    if rank == 0:
        S.add_speedups(rows_out)
        with open(a.out, "w") as f:
            for r in rows_out:
                f.write(json.dumps(r) + "\n")
    mcomm.shutdown()
    dist.destroy_process_group()
