"""The PNG figures of `megamoe bench report` (matplotlib, Agg backend), one function per
section of report_sections.py. Each returns the PNG file name it wrote, or None when the
section has no data to draw."""
import os

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib import ticker  # noqa: E402

DPI = 100
COLORS = {"megamoe": "#1f77b4", "torch": "#d62728", "mpi": "#2ca02c", "gloo": "#9467bd",
          "copy": "#7f7f7f"}


def _save(fig, out_dir, name):
    path = os.path.join(out_dir, name)
    fig.tight_layout()
    fig.savefig(path, dpi=DPI)
    plt.close(fig)
    return name


def _plain_log(ax, axis="y", values=None):
    """Log axis labelled with plain numbers (1, 2, 5 per decade), or exactly at `values`."""
    a = ax.yaxis if axis == "y" else ax.xaxis
    if values:
        a.set_major_locator(ticker.FixedLocator(values))
        a.set_minor_locator(ticker.NullLocator())
    else:
        lo, hi = sorted(a.get_view_interval())
        dense = lo > 0 and hi / lo <= 1e3
        a.set_major_locator(ticker.LogLocator(base=10, subs=(1.0, 2.0, 5.0) if dense else (1.0,)))
        a.set_minor_locator(ticker.LogLocator(base=10, subs=tuple(range(1, 10))))
    a.set_major_formatter(ticker.FuncFormatter(_plain))
    a.set_minor_formatter(ticker.NullFormatter())


def _plain(v, _=None):
    """1, 20, 500, 2K, 10K, 1M: short labels for log axes."""
    for div, unit in ((1e6, "M"), (1e3, "K")):
        if v >= div and (v / div) == int(v / div):
            return f"{v / div:g}{unit}"
    return f"{v:.0f}" if v >= 1 else f"{v:g}"


def _bar_values(ax, xs, vals, fmt="{:.2f}"):
    for x, v in zip(xs, vals):
        if v is not None:
            ax.annotate(fmt.format(v), (x, v), ha="center", va="bottom", fontsize=7)


def roofline(sec, out_dir):
    if not sec["points"]:
        return None
    fig, ax = plt.subplots(figsize=(11, 5.5))
    ais = [p["ai"] for p in sec["points"]]
    lo, hi = min(ais) / 2, max(ais) * 2
    xs = [lo * (hi / lo) ** (i / 200) for i in range(201)]
    for cores, style in zip(sorted(sec["roofs"]), ["-", "--", ":"]):
        p, b = sec["roofs"][cores]
        ax.plot(xs, [min(p, x * b) for x in xs], "k" + style, lw=1.2,
                label=f"roof, {cores} core{'s' if cores > 1 else ''}: {p:.0f} GFLOP/s, "
                      f"{b:.0f} GB/s")
    markers = {"grouped packed": "o", "grouped kn": "s", "onednn packed": "^",
               "onednn kn": "v", "megamoe O1": "*", "megamoe O0": "P", "torch EP": "X"}
    seen = set()
    for p in sec["points"]:
        key = (p["label"], p["cores"])
        color = (COLORS["torch"] if "torch" in p["label"] else
                 "#ff7f0e" if p["kind"] == "layer" else
                 COLORS["megamoe"] if p["cores"] == 1 else "#17becf")
        ax.scatter(p["ai"], p["gflops"], marker=markers.get(p["label"], "o"), color=color,
                   s=60 if p["kind"] == "layer" else 30, alpha=0.8, edgecolors="none",
                   label=None if key in seen else
                   f"{'GEMM ' if p['kind'] == 'gemm' else 'layer '}{p['label']}, {p['cores']} core"
                   + ("s" if p["cores"] > 1 else ""))
        seen.add(key)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("arithmetic intensity (FLOP per byte of compulsory traffic)")
    ax.set_ylabel("achieved GFLOP/s")
    ax.set_title("Roofline: GEMMs and layers under the probed peak and the measured copy rate")
    ax.grid(True, which="both", alpha=0.25)
    _plain_log(ax, "x")
    _plain_log(ax, "y")
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
    return _save(fig, out_dir, "roofline.png")


def tokens(sec, out_dir):
    s = sec["series"]
    if not s["T"]:
        return None
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(10, 4.2))
    for key, name, color in (("megamoe", "megamoe O1", COLORS["megamoe"]),
                             ("torch", "PyTorch EP layer", COLORS["torch"])):
        pts = [(t, v) for t, v in zip(s["T"], s[key + "_ms"]) if v is not None]
        if pts:
            a1.plot(*zip(*pts), "o-", color=color, label=name)
        pts = [(t, v) for t, v in zip(s["T"], s[key + "_pct"]) if v is not None]
        if pts:
            a2.plot(*zip(*pts), "o-", color=color, label=name)
    for a in (a1, a2):
        a.set_xscale("log", base=2)
        _plain_log(a, "x", s["T"])
        a.set_xlabel("tokens per rank (T)")
        a.grid(True, which="both", alpha=0.25)
        a.legend(fontsize=8)
    a1.set_yscale("log")
    _plain_log(a1, "y")
    a1.set_ylabel("forward+backward ms (slowest rank)")
    a1.set_title("time")
    a2.set_ylabel("% of the probed peak (cores used)")
    a2.set_ylim(bottom=0)
    a2.set_title("% of peak")
    fig.suptitle("Token sweep: H 2048, I 1024, E 8, K 2, EP 2, 1 worker per rank")
    return _save(fig, out_dir, "tokens.png")


def scaling(sec, out_dir):
    pts = sec["points"]
    if not pts:
        return None
    labels = [f"{p['ep']} rank{'s' if p['ep'] > 1 else ''}" +
              (f"\n{p['hosts']} hosts" if p["hosts"] > 1 else "") for p in pts]
    xs = range(len(pts))
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(10, 4.2))
    colors = [COLORS["megamoe"] if p["hosts"] == 1 else "#ff7f0e" for p in pts]
    a1.bar(xs, [p["us_per_token"] for p in pts], color=colors)
    a1.set_ylabel("us per token (fwd+bwd, global batch)")
    a1.set_title("time per token")
    a2.bar(xs, [p["pct"] or 0 for p in pts], color=colors)
    a2.set_ylabel("% of the probed peak of the cores used")
    a2.set_title("% of peak")
    for a in (a1, a2):
        a.set_xticks(list(xs))
        a.set_xticklabels(labels, fontsize=8)
        a.grid(True, axis="y", alpha=0.25)
    for i, p in enumerate(pts):
        a1.annotate(f"{p['us_per_token']:.0f} us, {p['cores']} core"
                    f"{'s' if p['cores'] > 1 else ''}", (i, p["us_per_token"]),
                    ha="center", va="bottom", fontsize=7)
    _bar_values(a2, xs, [p["pct"] for p in pts], "{:.0f} %")
    fig.suptitle(f"Scaling: the same job (large shape, {pts[0]['ep'] * pts[0]['T']} tokens in "
                 "all) over ranks")
    return _save(fig, out_dir, "scaling.png")


def skew(sec, out_dir):
    bars = [b for b in sec["bars"] if any(v is not None for _, v in b["series"])]
    if not bars:
        return None
    names = []
    for b in bars:
        for n, _ in b["series"]:
            if n not in names:
                names.append(n)
    fig, ax = plt.subplots(figsize=(10, 4.5))
    width = 0.8 / max(1, len(names))
    cmap = plt.get_cmap("tab10")
    for j, n in enumerate(names):
        vals = [dict(b["series"]).get(n) for b in bars]
        xs = [i + (j - (len(names) - 1) / 2) * width for i in range(len(bars))]
        ax.bar([x for x, v in zip(xs, vals) if v is not None], [v for v in vals if v is not None],
               width, label=n, color=cmap(j % 10))
        _bar_values(ax, xs, vals)
    ax.axhline(1.0, color="k", lw=0.8)
    ax.set_xticks(range(len(bars)))
    ax.set_xticklabels([b["label"] for b in bars], fontsize=8)
    ax.set_ylabel("fwd+bwd time relative to balanced")
    ax.set_title("Routing skew: the four patterns" +
                 (" and expert replicas" if sec["any_replicas"] else ""))
    ax.grid(True, axis="y", alpha=0.25)
    ax.legend(fontsize=8)
    return _save(fig, out_dir, "skew.png")


def decode(sec, out_dir):
    if not sec["lines"]:
        return None
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(10, 4.2))
    styles = {"megamoe": "o-", "mpi_alltoallv": "s--", "gloo": "^:"}
    drew_copy = False
    for name, pts in sorted(sec["lines"].items()):
        impl = name.split()[0]
        color = COLORS["megamoe" if impl == "megamoe" else "mpi" if "mpi" in impl else "gloo"]
        alpha = 1.0 if name.endswith("quant 0") else 0.55
        bs = [p[0] for p in pts]
        a1.plot(bs, [p[1] for p in pts], styles.get(impl, "o-"), color=color, alpha=alpha,
                label=name)
        if impl == "megamoe":
            cp = [(p[0], p[2]) for p in pts if p[2]]
            if cp:
                a1.plot(*zip(*cp), "-", color=COLORS["copy"], alpha=alpha, lw=2,
                        label=f"copy the same bytes once ({name.split(' ', 1)[1]})")
                drew_copy = True
                a2.plot(bs, [p[1] / p[2] if p[2] else None for p in pts], "o-", color=color,
                        alpha=alpha, label=name)
    all_bs = sorted({p[0] for pts in sec["lines"].values() for p in pts})
    a1.set_xscale("log", base=2)
    a1.set_yscale("log")
    _plain_log(a1, "x", all_bs)
    _plain_log(a1, "y")
    a1.set_xlabel("tokens per rank (BS)")
    a1.set_ylabel("dispatch + combine us")
    a1.set_title("time")
    a1.grid(True, which="both", alpha=0.25)
    a1.legend(fontsize=7)
    a2.set_xscale("log", base=2)
    _plain_log(a2, "x", all_bs)
    a2.set_ylim(bottom=0)
    a2.axhline(1.0, color="k", lw=0.8)
    a2.set_xlabel("tokens per rank (BS)")
    a2.set_ylabel("megamoe time / copy-once time")
    a2.set_title("vs one copy of the payload" if drew_copy else "(no copy rate measured)")
    a2.grid(True, which="both", alpha=0.25)
    if drew_copy:
        a2.legend(fontsize=7)
    fig.suptitle("Decode sizes: DispatchV2 + CombineV2, H 7168, K 8, E 64, 2 ranks")
    return _save(fig, out_dir, "decode.png")


def shmem(sec, out_dir):
    if not sec["lines"]:
        return None
    fig, ax = plt.subplots(figsize=(8, 4.2))
    for name, pts in sorted(sec["lines"].items()):
        ax.plot([p[0] for p in pts], [p[1] for p in pts], "o-", label=name)
    if sec["copy"]:
        ax.plot([c[0] for c in sec["copy"]], [c[1] * 1e-9 for c in sec["copy"]], "-",
                color=COLORS["copy"], lw=2, label="local copy, every core (this report)")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    _plain_log(ax, "y")
    ax.xaxis.set_major_formatter(ticker.FuncFormatter(
        lambda v, _: f"{v / 2**20:g} MiB" if v >= 2**20 else f"{v / 2**10:g} KiB"))
    ax.set_xlabel("bytes per transfer")
    ax.set_ylabel("GB/s per rank")
    ax.set_title("SHMEM put vs memcpy into the peer's mapping vs MPI_Put (2 ranks at once)")
    ax.grid(True, which="both", alpha=0.25)
    ax.legend(fontsize=8)
    return _save(fig, out_dir, "shmem.png")
