"""The figures' data and tables of `megamoe bench report`, derived from the benchmarks' JSON
rows and the machine record (report_run.py). Pure Python: every section returns a dict with
its tables and the series report_plots.py draws; nothing here times anything.

Models used (stated on the page too):
* GEMM bytes: every operand once, A and B bf16, C fp32: G * (2MK + 2KN + 4MN).
* Layer FLOPs: 18*H*I per (token, choice) over the job, as bench layer counts them.
* Layer bytes (compulsory traffic of one forward+backward over the job, N = ranks * T tokens,
  bf16): tokens in/out and their gradients 4NH, dispatched and combined rows both ways 4NKH,
  the saved intermediate [NK, 2I] written and read 4NKI, every weight read twice and its
  gradient written once 9EHI; times 2 bytes.
* Memory roof: traffic = 2 x bytes copied (read + write) at the measured copy rate.
"""
import math
import re

# bench layer's named shapes, for rows written before rows carried their dims
LAYER_SHAPES = {"seed": (1024, 512, 128, 4, 2), "large": (4096, 2048, 1024, 8, 2)}


# measured figures: floats even when the JSON wrote them without a fraction (117162)
MEASURED = ("fwd_bwd_ms", "fwd_ms", "bwd_ms", "tflops", "gflops", "dispatch_us", "combine_us",
            "GBps", "us", "cpu_ms")


def replicas_of(r):
    """Replica slots of a layer row (None without): its "replicas" field (0 = off), else the
    variant's "+rN" suffix."""
    n = r.get("replicas")
    if n is None:
        m = re.search(r"\+r(\d+)", str(r.get("schedule", "")))
        n = int(m.group(1)) if m else None
    return int(n) if n else None


def base_schedule(r):
    """The schedule of a layer row without its replica suffix ("O1+r2" -> "O1")."""
    return re.sub(r"\+r\d+", "", str(r.get("schedule", "")))


def rows(docs, name, training_step=False):
    """The rows of a benchmark; bench layer's training-step rows (weights changed every step)
    only with training_step=True, the frozen ones otherwise."""
    out = []
    for d in docs.get(name, []):
        for r in d.get("rows", []):
            if bool(r.get("training_step", False)) != training_step:
                continue
            r = {k: float(v) if k in MEASURED and isinstance(v, int) else v
                 for k, v in r.items()}
            r["_step"] = d.get("report_step", name)
            out.append(r)
    return out


def fmt(x, digits=3):
    """A number for a table cell: 3 significant digits, or '-'."""
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "-"
    if isinstance(x, bool):
        return "yes" if x else "no"
    if isinstance(x, int):
        return str(x)
    if x == 0:
        return "0"
    mag = int(math.floor(math.log10(abs(x))))
    if mag >= digits - 1:
        return f"{x:,.0f}"
    return f"{x:.{max(0, digits - 1 - mag)}f}"


def table(caption, headers, body):
    return {"caption": caption, "headers": headers, "rows": [[fmt(c) if not isinstance(c, str)
                                                               else c for c in r] for r in body]}


# ---- the machine ---------------------------------------------------------------------------

def peaks(docs, machine):
    """Per-core compute peak (GFLOP/s) and its unit from the GEMM rows (the built-in probe)."""
    for r in rows(docs, "gemm"):
        p = r.get("peak_gflops")
        if p is None and r.get("pct_peak"):
            p = 100.0 * r["gflops"] / (r["pct_peak"] * r["threads"])
        if p:
            return float(p), r.get("peak_unit", "?")
    return None, None


def copy_rates(machine):
    """(one core bytes/s, {size: per-core bytes/s with every core copying})."""
    c = machine.get("copy") or {}
    every = {int(k): v for k, v in (c.get("per_core_all_busy_Bps") or {}).items()}
    return c.get("one_core_Bps"), every


def copy_rate_at(every, size):
    """Per-core copy rate at `size` bytes: log-log interpolation, flat beyond the ends."""
    if not every:
        return None
    xs = sorted(every)
    if size <= xs[0]:
        return every[xs[0]]
    if size >= xs[-1]:
        return every[xs[-1]]
    for a, b in zip(xs, xs[1:]):
        if a <= size <= b:
            f = (math.log(size) - math.log(a)) / (math.log(b) - math.log(a))
            return math.exp(math.log(every[a]) * (1 - f) + math.log(every[b]) * f)
    return every[xs[-1]]


def roofs(docs, machine):
    """{cores: (peak GFLOP/s, memory traffic GB/s)} for 1 core and for every core."""
    p1, _ = peaks(docs, machine)
    one, every = copy_rates(machine)
    cores = int(machine.get("cores", 1))
    out = {}
    if p1 and one:
        out[1] = (p1, 2 * one * 1e-9)
    if p1 and every and cores > 1:
        out[cores] = (p1 * cores, 2 * every[max(every)] * cores * 1e-9)
    return out


def machine_section(docs, machine):
    p1, unit = peaks(docs, machine)
    one, every = copy_rates(machine)
    cores = int(machine.get("cores", 1))
    facts = [("CPU", machine.get("cpu", "?")), ("cores", str(cores)),
             ("ISA", machine.get("isa", "?"))]
    if p1:
        facts.append(("probed compute peak", f"{fmt(p1)} GFLOP/s per core ({unit}), "
                                             f"{fmt(p1 * cores)} GFLOP/s on {cores} cores"))
    else:
        facts.append(("probed compute peak", "not available (no GEMM rows)"))
    if one:
        big = max(every) if every else None
        facts.append(("copy rate", f"{fmt(one * 1e-9)} GB/s copied by one core; "
                      + (f"{fmt(every[big] * 1e-9)} GB/s per core with all {cores} copying "
                         f"({big >> 20} MiB buffers)" if big else "")
                      + " (memory roofs count read + write: 2x these)"))
    vers = machine.get("versions", {})
    return {"facts": facts, "versions": list(vers.items())}


def load_note(machine):
    """A sentence when other work shared the machine during the run, else ''."""
    cores = int(machine.get("cores", 1))
    ls = [machine.get(k) for k in ("load_start", "load_max", "load_end")]
    ls = [x for x in ls if isinstance(x, (int, float)) and math.isfinite(x)]
    if not ls:
        return ""
    start = machine.get("load_start", 0) or 0
    if start > 0.5 * cores or max(ls) > cores + 1:
        return (f"The machine was shared while these numbers were taken: load average "
                f"{fmt(start)} before the run and up to {fmt(max(ls))} during it on {cores} "
                "cores (the benchmarks themselves use at most "
                f"{cores}). Absolute times and % of peak are pessimistic; same-run ratios "
                "less so. Regenerate on a quiet machine with `megamoe bench report --out DIR`.")
    return ""


# ---- roofline ------------------------------------------------------------------------------

def layer_dims(r):
    if "hidden" in r:
        return r.get("tokens"), r["hidden"], r["intermediate"], r["experts"], r["top_k"]
    T, H, I, E, K = LAYER_SHAPES.get(r.get("shape"), (None,) * 5)
    return r.get("tokens", T), H, I, E, K


def layer_flops_bytes(r):
    T, H, I, E, K = layer_dims(r)
    if not H or not T:
        return None, None
    N = r.get("ep", 2) * T
    flops = 18.0 * H * I * N * K
    nbytes = 2.0 * (4 * N * H + 4 * N * K * H + 4 * N * K * I + 9 * E * H * I)
    return flops, nbytes


def cores_used(r, cores):
    return max(1, min(int(r.get("ep", 1)) * int(r.get("workers", 1) or 1), cores))


def roof_at(roof, ai):
    p, b = roof
    return min(p, ai * b)


def roofline_section(docs, machine):
    cores = int(machine.get("cores", 1))
    rf = roofs(docs, machine)
    pts, body = [], []
    for r in rows(docs, "gemm"):
        if r.get("quant", "bf16") != "bf16" or r.get("impl") == "decode":
            continue  # int8 / int4 weights and decode rows: their own pct_roofline (bench gemm)
        g, M, K, N = r.get("groups", 1), r["M"], r["K"], r["N"]
        ai = 2.0 * M * K * N / (2 * M * K + 2 * K * N + 4 * M * N)
        t = int(r.get("threads", 1))
        label = f"{r['impl']} {r['weights']}"
        shape = f"{M}x{K}x{N}" + (f" x{g}" if g > 1 else "")
        pts.append({"kind": "gemm", "label": label, "cores": t, "ai": ai, "gflops": r["gflops"]})
        body.append(["GEMM " + label, shape, t, ai, r["gflops"], _pct_roof(rf, t, ai, r["gflops"])])
    for step in ("layer", "tokens", "scaling"):
        for r in rows(docs, step) + rows(docs, step, training_step=True):
            if "prof" in str(r.get("schedule", "")) or "tflops" not in r:
                continue
            flops, nbytes = layer_flops_bytes(r)
            if not flops:
                continue
            ai = flops / nbytes
            c = cores_used(r, cores)
            impl = "torch EP" if r["impl"] == "torch" else f"megamoe {r['schedule']}"
            case = (f"{r.get('shape')} T={layer_dims(r)[0]} {r.get('routing')} EP{r.get('ep')}"
                    + (f" {r['hosts']} hosts" if r.get("hosts", 1) > 1 else "")
                    + (f" replicas {replicas_of(r)}" if replicas_of(r) else ""))
            gf = r["tflops"] * 1e3
            pts.append({"kind": "layer", "label": impl, "cores": c, "ai": ai, "gflops": gf})
            body.append(["layer " + impl, case, c, ai, gf, _pct_roof(rf, c, ai, gf)])
    return {"roofs": rf, "points": pts,
            "table": table("every GEMM row (bench gemm) and layer row (bench layer, the token "
                           "sweep and the scaling runs)",
                           ["what", "case", "cores", "FLOP/byte", "GFLOP/s", "% of roof"], body)}


def _pct_roof(rf, c, ai, gf):
    if c in rf:
        return 100.0 * gf / roof_at(rf[c], ai)
    if 1 in rf:  # scale the one-core roof
        p, b = rf[1]
        return 100.0 * gf / roof_at((p * c, b * c), ai)
    return None


# ---- token sweep ---------------------------------------------------------------------------

def pct_peak(r, p1, cores):
    if not p1 or "tflops" not in r:
        return None
    return 100.0 * r["tflops"] * 1e3 / (p1 * cores_used(r, cores))


def tokens_section(docs, machine):
    p1, _ = peaks(docs, machine)
    cores = int(machine.get("cores", 1))
    mm, th = {}, {}
    for r in rows(docs, "tokens"):
        T = layer_dims(r)[0]
        if r["impl"] == "megamoe" and r.get("schedule") == "O1":
            mm[T] = r
        elif r["impl"] == "torch":
            th[T] = r
    Ts = sorted(set(mm) | set(th))
    body = []
    for T in Ts:
        a, b = mm.get(T, {}), th.get(T, {})
        body.append([T, a.get("fwd_bwd_ms"), a.get("fwd_ms"), a.get("bwd_ms"),
                     b.get("fwd_bwd_ms"),
                     b["fwd_bwd_ms"] / a["fwd_bwd_ms"] if a and b else None,
                     a.get("tflops"), pct_peak(a, p1, cores) if a else None,
                     pct_peak(b, p1, cores) if b else None])
    series = {"T": Ts,
              "megamoe_ms": [mm[T]["fwd_bwd_ms"] if T in mm else None for T in Ts],
              "torch_ms": [th[T]["fwd_bwd_ms"] if T in th else None for T in Ts],
              "megamoe_pct": [pct_peak(mm[T], p1, cores) if T in mm else None for T in Ts],
              "torch_pct": [pct_peak(th[T], p1, cores) if T in th else None for T in Ts]}
    return {"series": series,
            "table": table("fwd+bwd of the slowest rank (median); % of the probed peak of the "
                           "cores the job used",
                           ["T per rank", "megamoe ms", "fwd ms", "bwd ms", "torch ms",
                            "torch / megamoe", "megamoe TFLOP/s", "megamoe % peak",
                            "torch % peak"], body)}


# ---- scaling -------------------------------------------------------------------------------

def scaling_section(docs, machine):
    p1, _ = peaks(docs, machine)
    cores = int(machine.get("cores", 1))
    pts = []
    for r in rows(docs, "scaling"):
        if r["impl"] != "megamoe" or r.get("schedule") != "O1" or r.get("routing") != "balanced":
            continue
        T = layer_dims(r)[0]
        ep, hosts = int(r["ep"]), int(r.get("hosts", 1))
        if any((p["ep"], p["hosts"], p["T"]) == (ep, hosts, T) for p in pts):
            continue  # bench layer --hosts H also runs the job on one host first: seen already
        pts.append({"ep": ep, "hosts": hosts, "T": T, "ms": r["fwd_bwd_ms"],
                    "us_per_token": r["fwd_bwd_ms"] * 1e3 / (ep * T),
                    "cores": cores_used(r, cores), "tflops": r.get("tflops"),
                    "pct": pct_peak(r, p1, cores)})
    pts.sort(key=lambda p: (p["hosts"], p["ep"]))
    base = next((p for p in pts if p["ep"] == 1 and p["hosts"] == 1), None)
    body = [[p["ep"], p["hosts"], p["T"], p["ep"] * p["T"], p["ms"], p["us_per_token"],
             p["cores"], p["tflops"], p["pct"],
             base["us_per_token"] / p["us_per_token"] if base else None] for p in pts]
    note = None
    if not any(p["hosts"] > 1 for p in pts):
        note = machine.get("hosts") or "not available: no rows with \"hosts\" > 1 in the data"
    return {"points": pts, "hosts_note": note,
            "table": table("the same job (large shape, the global batch split over the ranks, "
                           "1 worker per rank); % of the probed peak of the cores used",
                           ["ranks", "hosts", "T per rank", "tokens in all", "fwd+bwd ms",
                            "us per token", "cores used", "TFLOP/s", "% peak",
                            "speed-up vs 1 rank"], body)}


# ---- skew ----------------------------------------------------------------------------------

ROUTINGS = ["balanced", "zero", "skew", "single"]


def skew_section(docs, machine):
    groups = {}
    for r in rows(docs, "layer"):
        if r["impl"] != "megamoe" or "prof" in str(r.get("schedule", "")):
            continue
        key = (r.get("shape"), layer_dims(r)[0], int(r.get("workers", 1)), base_schedule(r))
        groups.setdefault(key, {})[(r.get("routing"), replicas_of(r))] = r
    body, bars = [], []
    for key in sorted(groups, key=lambda k: tuple(str(x) for x in k)):
        g = groups[key]
        base = g.get(("balanced", None))
        order = sorted(g, key=lambda k: (k[1] is not None, k[1] or 0,
                                         ROUTINGS.index(k[0]) if k[0] in ROUTINGS else 9))
        label = f"{key[0]} T={key[1]}, {key[2]} worker{'s' if key[2] != 1 else ''}, {key[3]}"
        series = []
        for rk in order:
            r = g[rk]
            rel = r["fwd_bwd_ms"] / base["fwd_bwd_ms"] if base else None
            name = rk[0] + (f" + {rk[1]} replicas" if rk[1] is not None else "")
            series.append((name, rel))
            body.append([label, name, r["fwd_bwd_ms"], rel])
        bars.append({"label": label, "series": series})
    any_replicas = any(k[1] is not None for g in groups.values() for k in g)
    note = None if any_replicas else (machine.get("replicas") or
                                      "not available: no rows with \"replicas\" in the data")
    frozen = {(r.get("shape"), layer_dims(r)[0], r.get("routing"), int(r.get("workers", 1)),
               base_schedule(r)): r for r in rows(docs, "layer") if r["impl"] == "megamoe"}
    steps = []
    for r in rows(docs, "layer", training_step=True):
        sched = base_schedule(r).replace("+step", "")
        key = (r.get("shape"), layer_dims(r)[0], r.get("routing"), int(r.get("workers", 1)), sched)
        f = frozen.get(key)
        steps.append([f"{key[0]} T={key[1]}, {key[3]} worker{'s' if key[3] != 1 else ''}",
                      key[2], sched, r["fwd_bwd_ms"], r.get("pct_peak"),
                      r["fwd_bwd_ms"] / f["fwd_bwd_ms"] if f else None])
    return {"bars": bars, "replicas_note": note, "any_replicas": any_replicas,
            "table": table("fwd+bwd of the slowest rank and its ratio to balanced routing "
                           "(same shape, workers and schedule)",
                           ["job", "routing", "fwd+bwd ms", "vs balanced"], body),
            "steps": table("training steps: the weights change every step, so every forward "
                           "re-packs them (bench layer \"+step\" rows); % of the probed peak "
                           "of the cores used, and the time against the frozen-weights row",
                           ["job", "routing", "schedule", "fwd+bwd ms", "% peak", "vs frozen"],
                           steps)}


# ---- decode --------------------------------------------------------------------------------

def decode_section(docs, machine):
    _, every = copy_rates(machine)
    lines, body = {}, []
    for r in rows(docs, "dispatch"):
        total = r["dispatch_us"] + r["combine_us"]
        nbytes = r["GBps"] * 1e9 * total * 1e-6
        rate = copy_rate_at(every, nbytes)
        copy_us = nbytes / rate * 1e6 if rate else None
        name = f"{r['impl']} quant {r['quant_mode']}"
        lines.setdefault(name, []).append((r["bs"], total, copy_us))
        body.append([name, r["bs"], r["dispatch_us"], r["combine_us"], total, nbytes / 2**20,
                     copy_us, total / copy_us if copy_us else None])
    for v in lines.values():
        v.sort()
    return {"lines": lines,
            "table": table("per rank, rank 0's medians (bench dispatch: H 7168, K 8, E 64, "
                           "2 ranks); copy once = the payload bytes at this machine's copy "
                           "rate for that size with every core copying",
                           ["impl", "BS", "dispatch us", "combine us", "total us",
                            "payload MiB", "copy once us", "total / copy"], body)}


# ---- SHMEM ---------------------------------------------------------------------------------

def shmem_section(docs, machine):
    _, every = copy_rates(machine)
    lines, body, lat = {}, [], []
    for r in rows(docs, "shmem"):
        if "size_bytes" in r:
            lines.setdefault(r["impl"], []).append((r["size_bytes"], r["GBps"]))
            body.append([r["impl"], r["size_bytes"] >> 10, r["GBps"]])
        else:
            lat.append([r["impl"], r["us"]])
    for v in lines.values():
        v.sort()
    return {"lines": lines, "copy": sorted(every.items()),
            "table": table("GB/s per rank, both ranks moving data at once (bench shmem)",
                           ["impl", "KiB", "GB/s"], body),
            "latency": table("latencies (bench shmem)", ["what", "us"], lat)}
