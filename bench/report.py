"""`megamoe bench report --out DIR [--quick] [--from DIR] [--note TEXT]`: the performance story
as one page. Runs the gemm, shmem, dispatch and layer benchmarks plus the token sweep and the
scaling runs through the megamoe binary (or reads their saved JSON with --from), measures this
machine's copy rate, and writes DIR/report.html (self-contained: the PNGs are inlined), the
PNGs beside it, the raw JSON in DIR/data/ and each benchmark's stderr in DIR/logs/.

Started by the CLI (bench/bench_report.c) as `/usr/bin/python3 report.py --megamoe BIN ...`.
Exit status: 0 when every step gave its rows, 1 when one failed (the page is still written
and names it), 2 for bad usage.
"""
import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import report_html  # noqa: E402
import report_run  # noqa: E402
import report_sections as S  # noqa: E402


def parse_args(argv):
    ap = argparse.ArgumentParser(
        prog="megamoe bench report",
        description="Run the benchmarks and sweeps (or read saved JSON) and write an HTML page "
                    "with PNG plots: roofline, token sweep, scaling, routing skew, decode "
                    "sizes, SHMEM.")
    ap.add_argument("--megamoe", required=True, help=argparse.SUPPRESS)
    ap.add_argument("--out", required=True, metavar="DIR",
                    help="where report.html, the PNGs, data/ and logs/ go (created)")
    ap.add_argument("--quick", action="store_true",
                    help="fewer points and repeats (a few minutes on 2 quiet cores)")
    ap.add_argument("--from", dest="from_dir", metavar="DIR",
                    help="render from saved JSON instead of running: a previous report "
                         "directory, or a directory of `megamoe bench NAME > NAME.json` "
                         "outputs (gemm, shmem, dispatch, layer, tokens, scaling; several "
                         "runs may be appended to one file)")
    ap.add_argument("--note", action="append", default=[], metavar="TEXT",
                    help="a sentence to show at the top of the page (repeatable; kept in "
                         "data/machine.json, replaced by --note on a re-render)")
    ap.add_argument("--step-timeout", type=int, default=3600, metavar="S",
                    help="seconds one benchmark may run (default 3600)")
    return ap.parse_args(argv)


def render(out_dir, docs, machine, failures, notes):
    try:
        import report_plots as plots
    except ImportError as e:  # matplotlib missing
        sys.exit(f"megamoe bench report: {e}: install python3-matplotlib (make deps)")
    secs = {"machine": S.machine_section(docs, machine),
            "roofline": S.roofline_section(docs, machine),
            "tokens": S.tokens_section(docs, machine),
            "scaling": S.scaling_section(docs, machine),
            "skew": S.skew_section(docs, machine),
            "decode": S.decode_section(docs, machine),
            "shmem": S.shmem_section(docs, machine)}
    figs = {}
    for name in ("roofline", "tokens", "scaling", "skew", "decode", "shmem"):
        figs[name] = getattr(plots, name)(secs[name], out_dir)
    for name in ("gemm", "shmem", "dispatch", "layer", "tokens", "scaling"):
        if not docs.get(name):
            failures = failures + [f"{name}: no benchmark output"]
    text = report_html.page(out_dir, machine, secs, figs, failures,
                            [S.load_note(machine)] + list(notes))
    path = os.path.join(out_dir, "report.html")
    with open(path, "w") as f:
        f.write(text)
    return path, figs, failures


def main(argv):
    args = parse_args(argv)
    try:
        import matplotlib  # noqa: F401  (before any benchmark runs)
    except ImportError as e:
        sys.exit(f"megamoe bench report: {e}: install python3-matplotlib (make deps)")
    if not os.access(args.megamoe, os.X_OK):
        sys.exit(f"megamoe bench report: {args.megamoe} is not executable")
    out_dir = os.path.abspath(args.out)
    os.makedirs(os.path.join(out_dir, "data" if args.from_dir else "logs"), exist_ok=True)
    t0 = time.time()

    def log(msg):
        print(f"[report {time.time() - t0:5.0f} s] {msg}", file=sys.stderr, flush=True)

    docs, machine, failures = report_run.main_collect(args, out_dir, log)
    path, figs, failures = render(out_dir, docs, machine, failures, machine.get("notes", []))
    drawn = [f for f in figs.values() if f]
    log(f"wrote {path} ({len(drawn)} figures: {', '.join(drawn)})")
    for f in failures:
        log(f"missing: {f}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
