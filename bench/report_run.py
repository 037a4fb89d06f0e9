"""Collecting the data of `megamoe bench report`: the machine, the copy bandwidth, and the JSON
of every benchmark run through the megamoe binary (or read back from a saved directory).

A data directory holds one file per step, each the concatenated JSON documents that
`megamoe bench <name>` printed on stdout (several runs of one step are appended), plus
machine.json (this module's own record of the machine, versions and copy bandwidths).
"""
import importlib.metadata
import json
import multiprocessing as mp
import os
import platform
import re
import subprocess
import sys
import time

import numpy as np

# The steps of a report: (file name, title, the arguments of `megamoe bench`, quick / full).
# The layer's dims for the sweeps are the "large" shape: H 2048, I 1024, E 8, K 2.
TOKENS_FULL = [128, 256, 512, 1024, 2048, 4096, 8192]
TOKENS_QUICK = [128, 512, 2048]
SCALING_TOKENS = {"full": 4096, "quick": 1024}  # the global batch, split over the ranks
DECODE_BS_FULL = [8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096]
DECODE_BS_QUICK = [8, 64, 512, 4096]


def bench_steps(quick, layer_help):
    """The benchmark invocations of a report, [(file, label, argv)], in run order."""
    mode = "quick" if quick else "full"
    it = ["--iters", "1", "--warmup", "1"] if quick else ["--iters", "3", "--warmup", "1"]
    steps = [
        ("gemm", "GEMM", ["gemm"] + (["--quick"] if quick else [])),
        ("shmem", "SHMEM", ["shmem"] + (["--quick"] if quick else [])),
        ("dispatch", "dispatch+combine over decode batch sizes",
         ["dispatch", "--bs", ",".join(map(str, DECODE_BS_QUICK if quick else DECODE_BS_FULL)),
          "--zero-fill-only"] +
         # quick: no gloo side (tens of seconds per call at BS 4096) and no int8 transport
         (["--quant", "0", "--reps", "3", "--no-gloo"] if quick else ["--quant", "0,2"])),
    ]
    # the layer benchmark itself: every routing pattern (the skew figure)
    layer = ["layer", "--workers", "1", "--routing", "balanced,zero,skew,single"]
    if quick:
        layer += ["--shapes", "seed", "--schedule", "O1", "--profile-variant", "no",
                  "--iters", "2", "--warmup", "1"]
    steps.append(("layer", "layer, four routing patterns", layer))
    if "--replicas" in layer_help:  # expert replicas (a later bench layer option)
        steps.append(("layer", "layer, skewed routing with expert replicas",
                      ["layer", "--workers", "1", "--routing", "skew,single", "--replicas", "2",
                       "--schedule", "O1", "--profile-variant", "no", "--torch", "no"] +
                      (["--shapes", "seed"] + it if quick else [])))
    tokens = TOKENS_QUICK if quick else TOKENS_FULL
    steps.append(("tokens", "token sweep (H 2048, I 1024, E 8, K 2, EP 2)",
                  ["layer", "--shapes", "large", "--tokens", ",".join(map(str, tokens)),
                   "--workers", "1", "--routing", "balanced", "--schedule", "O1",
                   "--profile-variant", "no", "--torch", "yes"] + it))
    g = SCALING_TOKENS[mode]
    for ranks in (1, 2, 4):
        steps.append(("scaling", f"scaling, {ranks} rank(s)", scaling_args(g, ranks, it)))
    if "--hosts" in layer_help:
        for ranks in ((2,) if quick else (2, 4)):
            steps.append(("scaling", f"scaling, {ranks} ranks on 2 simulated hosts",
                          scaling_args(g, ranks, it) + ["--hosts", "2"]))
    return steps


def scaling_args(global_tokens, ranks, it):
    """The same job (the large shape, global_tokens in all) on `ranks` ranks."""
    return ["layer", "--shapes", "large", "--tokens", str(global_tokens // ranks), "--ranks",
            str(ranks), "--workers", "1", "--routing", "balanced", "--schedule", "O1",
            "--profile-variant", "no", "--torch", "no"] + it


def parse_docs(text):
    """Every JSON object in text (benchmark outputs appended one after another)."""
    dec, docs, i = json.JSONDecoder(), [], 0
    while True:
        while i < len(text) and text[i].isspace():
            i += 1
        if i >= len(text):
            return docs
        doc, i = dec.raw_decode(text, i)
        docs.append(doc)


def usage_error(msg):
    print(f"megamoe bench report: {msg}", file=sys.stderr)
    sys.exit(2)


def load_dir(path):
    """{step name: [docs]} and machine from a data directory (or a report directory)."""
    if os.path.isdir(os.path.join(path, "data")):
        path = os.path.join(path, "data")
    if not os.path.isdir(path):
        usage_error(f"--from {path}: no such directory")
    docs, machine = {}, None
    for name in sorted(os.listdir(path)):
        if not name.endswith(".json"):
            continue
        with open(os.path.join(path, name)) as f:
            text = f.read()
        try:
            parsed = parse_docs(text)
        except ValueError as e:
            usage_error(f"--from: {os.path.join(path, name)} is not benchmark JSON ({e})")
        if name == "machine.json":
            machine = parsed[0] if parsed else None
        else:
            docs[name[:-5]] = parsed
    if not docs and machine is None:
        usage_error(f"--from {path}: no benchmark JSON there (gemm.json, layer.json, ...)")
    return docs, machine


def run_step(megamoe, argv, log_path, timeout):
    """Run `megamoe bench ARGV`; (docs, error message or None). stderr goes to log_path."""
    t0 = time.time()
    with open(log_path, "a") as log:
        log.write(f"$ megamoe bench {' '.join(argv)}\n")
        log.flush()
        try:
            r = subprocess.run([megamoe, "bench"] + argv, stdout=subprocess.PIPE, stderr=log,
                               text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            return [], f"did not finish within {timeout} s"
        log.write(f"# exit status {r.returncode} after {time.time() - t0:.1f} s\n")
    try:
        docs = parse_docs(r.stdout)
    except ValueError:
        docs = []
    if r.returncode != 0 or not docs:
        with open(log_path) as f:
            lines = [ln.strip() for ln in f.read().splitlines() if ln.strip()]
        said = [ln for ln in lines if re.search(r"error|fail|not found|cannot", ln, re.I)]
        return docs, f"exit status {r.returncode}: " + " | ".join(said[-1:] or lines[-2:])
    return docs, None


# ---- the machine ---------------------------------------------------------------------------

def _cmd(argv):
    try:
        r = subprocess.run(argv, capture_output=True, text=True, timeout=30)
        return (r.stdout or r.stderr).strip()
    except (OSError, subprocess.TimeoutExpired):
        return ""


def _dpkg_version(pkg):
    v = _cmd(["dpkg-query", "-W", "-f=${Version}", pkg])
    return v if v and "no packages" not in v else "not installed"


def loadavg():
    try:
        with open("/proc/loadavg") as f:
            return float(f.read().split()[0])
    except OSError:
        return float("nan")


def machine_info(megamoe):
    """CPU model, cores, ISA and versions (the copy bandwidth is added by the caller)."""
    info = _cmd([megamoe, "info"])
    cpu = ""
    try:
        with open("/proc/cpuinfo") as f:
            m = re.search(r"^model name\s*:\s*(.*)$", f.read(), re.M)
            cpu = m.group(1).strip() if m else ""
    except OSError:
        pass
    cores = os.cpu_count() or 1
    m = re.search(r"cpu: .*?, (\d+) cores", info)
    if m:
        cores = int(m.group(1))
    versions = {
        "megamoe": _cmd([megamoe, "--version"]).replace("megamoe ", ""),
        "python": platform.python_version(),
        "numpy": np.__version__,
        "oneDNN (libdnnl-dev)": _dpkg_version("libdnnl-dev"),
        "Open MPI": (_cmd(["mpirun", "--version"]).splitlines() or ["not found"])[0],
        "gcc": (_cmd(["gcc", "--version"]).splitlines() or ["not found"])[0],
        "kernel": platform.release(),
    }
    for pkg in ("torch", "matplotlib"):  # without importing them (torch takes seconds)
        try:
            versions[pkg] = importlib.metadata.version(pkg)
        except importlib.metadata.PackageNotFoundError:
            versions[pkg] = "not installed"
    isa = re.search(r"^isa: (.*)$", info, re.M)
    return {"cpu": cpu or "unknown", "cores": cores, "isa": isa.group(1) if isa else "unknown",
            "megamoe_info": info, "versions": versions}


# ---- copy bandwidth ------------------------------------------------------------------------

COPY_SIZES_FULL = [1 << s for s in range(16, 29)]           # 64 KiB .. 256 MiB
COPY_SIZES_QUICK = [1 << 16, 1 << 20, 1 << 24, 1 << 28]


def _copy_worker(sizes, trials, barrier, queue, index):
    if hasattr(os, "sched_setaffinity"):
        try:
            cpus = sorted(os.sched_getaffinity(0))
            os.sched_setaffinity(0, {cpus[index % len(cpus)]})
        except OSError:
            pass
    out = {}
    for size in sizes:
        src = np.ones(size, dtype=np.uint8)
        dst = np.zeros(size, dtype=np.uint8)
        reps = max(1, (64 << 20) // size)  # ~64 MiB copied per trial
        np.copyto(dst, src)
        rates = []
        for _ in range(trials):
            barrier.wait()
            t0 = time.perf_counter()
            for _ in range(reps):
                np.copyto(dst, src)
            rates.append(size * reps / (time.perf_counter() - t0))
        out[size] = float(np.median(rates))
        del src, dst
    queue.put((index, out))


def copy_bandwidth(procs, sizes, trials):
    """Median bytes copied per second per process, with `procs` processes copying at once
    (each its own buffers, pinned to its own core): {size: bytes/s}."""
    ctx = mp.get_context("fork")
    barrier, queue = ctx.Barrier(procs), ctx.Queue()
    ps = [ctx.Process(target=_copy_worker, args=(sizes, trials, barrier, queue, i))
          for i in range(procs)]
    for p in ps:
        p.start()
    results = [queue.get(timeout=600) for _ in ps]
    for p in ps:
        p.join()
    per = {}
    for size in sizes:  # the slowest process: they ran at the same time
        per[size] = min(r[1][size] for r in results)
    return per


def measure_copy(cores, quick):
    """The copy rates of this machine: one process, and every core at once, over sizes."""
    sizes = COPY_SIZES_QUICK if quick else COPY_SIZES_FULL
    trials = 3 if quick else 7
    one = copy_bandwidth(1, sizes[-1:], trials)
    every = copy_bandwidth(max(1, cores), sizes, trials)
    return {"method": "numpy.copyto of uint8 buffers, one process per core, pinned; median of "
                      f"{trials} trials of ~64 MiB each",
            "one_core_Bps": one[sizes[-1]], "size_bytes": sizes[-1], "procs": max(1, cores),
            "per_core_all_busy_Bps": {str(k): v for k, v in every.items()}}


def main_collect(args, out_dir, log):
    """Run (or load) everything; returns (docs, machine, failures)."""
    data_dir = os.path.join(out_dir, "data")
    os.makedirs(data_dir, exist_ok=True)
    failures = []
    if args.from_dir:
        docs, machine = load_dir(args.from_dir)
        if machine is None:
            log("no machine.json in --from: describing this machine and measuring its copy "
                "bandwidth now")
    else:
        docs, machine = {}, None
    if machine is None:
        machine = machine_info(args.megamoe)
        machine["load_start"] = loadavg()
        t0 = time.time()
        # rendering saved data: the short measurement is enough for the roofs
        machine["copy"] = measure_copy(machine["cores"], args.quick or bool(args.from_dir))
        log(f"copy bandwidth measured in {time.time() - t0:.0f} s")
    machine.setdefault("quick", bool(args.quick))
    if args.note:  # kept with the data, so a re-render shows them; --note again replaces them
        machine["notes"] = list(args.note)
    if not args.from_dir:
        machine["started"] = time.strftime("%Y-%m-%d %H:%M:%S %Z")
        layer_help = _cmd([args.megamoe, "bench", "layer", "--help"])
        steps = bench_steps(args.quick, layer_help)
        if "--hosts" not in layer_help:
            machine["hosts"] = "not available: this megamoe has no 'bench layer --hosts'"
        elif os.geteuid() != 0:
            machine["hosts"] = "not available: simulated hosts need root"
            steps = [s for s in steps if "--hosts" not in s[2]]
        if "--replicas" not in layer_help:
            machine["replicas"] = "not available: this megamoe has no 'bench layer --replicas'"
        for f in {s[0] for s in steps}:
            open(os.path.join(data_dir, f + ".json"), "w").close()
        t_all = time.time()
        for i, (name, label, argv) in enumerate(steps):
            machine["load_max"] = max(machine.get("load_max", 0.0), loadavg())
            t0 = time.time()
            log(f"[{i + 1}/{len(steps)}] {label}: megamoe bench {' '.join(argv)}")
            got, err = run_step(args.megamoe, argv, os.path.join(out_dir, "logs", name + ".log"),
                                timeout=args.step_timeout)
            with open(os.path.join(data_dir, name + ".json"), "a") as f:
                for d in got:
                    d["report_step"] = label
                    f.write(json.dumps(d) + "\n")
            docs.setdefault(name, []).extend(got)
            if err:
                if "--hosts" in argv:
                    machine["hosts"] = f"not available: the run failed ({err})"
                elif "--replicas" in argv:
                    machine["replicas"] = f"not available: the run failed ({err})"
                else:
                    failures.append(f"{label}: {err}")
                log(f"    failed: {err}")
            else:
                log(f"    done in {time.time() - t0:.0f} s")
        machine["load_end"] = loadavg()
        machine["seconds"] = time.time() - t_all
        machine["command"] = "megamoe bench report" + (" --quick" if args.quick else "")
    with open(os.path.join(data_dir, "machine.json"), "w") as f:
        json.dump(machine, f, indent=1)
    if args.from_dir:  # keep the inputs beside the page, so the report can be re-rendered
        for name, ds in docs.items():
            with open(os.path.join(data_dir, name + ".json"), "w") as f:
                for d in ds:
                    f.write(json.dumps(d) + "\n")
    return docs, machine, failures


if __name__ == "__main__":
    sys.exit("report_run.py is a module of bench/report.py")
