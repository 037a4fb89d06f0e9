"""The page of `megamoe bench report`: one self-contained HTML file (the PNGs inlined as data
URIs, no scripts, no network) with each figure above the table of numbers behind it."""
import base64
import html
import os

CSS = """
body { font-family: sans-serif; max-width: 1100px; margin: 1em auto; padding: 0 1em;
       color: #222; line-height: 1.4; }
h1 { font-size: 1.6em; } h2 { border-bottom: 1px solid #ccc; padding-bottom: .2em; }
table { border-collapse: collapse; font-size: .85em; margin: .5em 0 1.5em; }
th, td { border: 1px solid #ccc; padding: .2em .5em; text-align: right; }
th { background: #f0f0f0; } td:first-child, th:first-child { text-align: left; }
caption { caption-side: top; text-align: left; font-style: italic; padding: .3em 0; }
.note { background: #fff4d6; border-left: 4px solid #e0a800; padding: .5em 1em; }
.missing { color: #a00; } img { max-width: 100%; border: 1px solid #eee; }
code { background: #f4f4f4; padding: 0 .2em; }
"""


def esc(x):
    return html.escape(str(x))


def table_html(t):
    if not t or not t["rows"]:
        return "<p class='missing'>no rows</p>"
    head = "".join(f"<th>{esc(h)}</th>" for h in t["headers"])
    body = "".join("<tr>" + "".join(f"<td>{esc(c)}</td>" for c in r) + "</tr>" for r in t["rows"])
    return (f"<table><caption>{esc(t['caption'])}</caption><thead><tr>{head}</tr></thead>"
            f"<tbody>{body}</tbody></table>")


def img_html(out_dir, name, alt):
    if not name:
        return "<p class='missing'>no figure: the benchmark gave no rows for it</p>"
    with open(os.path.join(out_dir, name), "rb") as f:
        data = base64.b64encode(f.read()).decode("ascii")
    return (f"<p><img src='data:image/png;base64,{data}' alt='{esc(alt)}' "
            f"data-file='{esc(name)}'></p>")


def section(sid, title, intro, figure, tables, notes=()):
    parts = [f"<h2 id='{sid}'>{esc(title)}</h2>", f"<p>{intro}</p>"]
    parts += [f"<p class='note'>{esc(n)}</p>" for n in notes if n]
    parts.append(figure)
    parts += [table_html(t) for t in tables]
    return "\n".join(parts)


def page(out_dir, machine, secs, figs, failures, note):
    m = secs["machine"]
    facts = "".join(f"<tr><td>{esc(k)}</td><td style='text-align:left'>{esc(v)}</td></tr>"
                    for k, v in m["facts"])
    vers = "".join(f"<tr><td>{esc(k)}</td><td style='text-align:left'>{esc(v)}</td></tr>"
                   for k, v in m["versions"])
    when = machine.get("started", "?")
    dur = machine.get("seconds")
    cmd = machine.get("command", "megamoe bench report")
    notes = [n for n in note if n]
    head = [
        "<!DOCTYPE html><html><head><meta charset='utf-8'>",
        "<title>megamoe performance report</title>", f"<style>{CSS}</style></head><body>",
        "<h1>megamoe performance report</h1>",
        f"<p>Taken {esc(when)}" + (f" in {dur / 60:.1f} min" if dur else "") +
        f" with <code>{esc(cmd)}</code>" +
        (" (quick: fewer points and repeats)" if machine.get("quick") else "") +
        ". Regenerate the page from the saved data with <code>megamoe bench report --from "
        "DIR --out DIR</code>; every figure's numbers are in the table under it and the raw "
        "benchmark JSON in <code>data/</code> beside this page.</p>",
    ]
    head += [f"<p class='note'>{esc(n)}</p>" for n in notes]
    if failures:
        head.append("<p class='note missing'>Steps that failed (their figures are missing or "
                    "partial):<br>" + "<br>".join(esc(f) for f in failures) + "</p>")
    head.append("<p>Contents: <a href='#machine'>machine</a> · <a href='#roofline'>roofline"
                "</a> · <a href='#tokens'>token sweep</a> · <a href='#scaling'>scaling</a> · "
                "<a href='#skew'>skew</a> · <a href='#decode'>decode</a> · <a href='#shmem'>"
                "SHMEM</a> · <a href='#method'>method</a></p>")
    head.append("<h2 id='machine'>The machine</h2><table><tbody>" + facts + "</tbody></table>"
                "<table><caption>versions</caption><tbody>" + vers + "</tbody></table>")
    r, t, s, k, d, sh = (secs[x] for x in ("roofline", "tokens", "scaling", "skew", "decode",
                                           "shmem"))
    body = [
        section("roofline", "Roofline",
                "Every GEMM row of <code>bench gemm</code> and every layer row (megamoe O0/O1 "
                "and the PyTorch EP layer) as achieved GFLOP/s against arithmetic intensity, "
                "under the probed BF16 compute peak and the memory roof of the measured copy "
                "rate, for one core and for every core. GEMMs and the layer sit far right of "
                "the ridge: they are compute-bound, so % of peak is the figure of merit.",
                img_html(out_dir, figs.get("roofline"), "roofline"), [r["table"]]),
        section("tokens", "Token sweep",
                "The layer at H 2048, I 1024, E 8, K 2 on 2 ranks (1 worker each), T = tokens "
                "per rank: forward+backward time and % of peak, beside the pure-PyTorch EP "
                "layer <code>bench layer</code> compares with (same data).",
                img_html(out_dir, figs.get("tokens"), "token sweep"), [t["table"]]),
        section("scaling", "Scaling",
                "The same job, its global batch split over 1, 2 and 4 ranks (and 2 simulated "
                "hosts when <code>bench layer --hosts</code> is available): time per token "
                "and % of the peak of the cores used. Ranks beyond the core count share "
                "cores.", img_html(out_dir, figs.get("scaling"), "scaling"), [s["table"]],
                [("2 simulated hosts: " + s["hosts_note"]) if s["hosts_note"] else ""]),
        section("skew", "Routing skew",
                "The four routing patterns of <code>bench layer</code> (balanced; zero: odd "
                "experts and the last rank's get nothing; skew: 3/4 of first choices to expert "
                "0; single: every token to rank 0's experts), time relative to balanced, and "
                "expert replicas when <code>bench layer --replicas</code> is available.",
                img_html(out_dir, figs.get("skew"), "skew"), [k["table"], k["steps"]],
                [("expert replicas: " + k["replicas_note"]) if k["replicas_note"] else ""]),
        section("decode", "Decode sizes",
                "DispatchV2 + CombineV2 at BS = 8 … 4096 tokens per rank (H 7168, K 8 of E 64, "
                "2 ranks) beside MPI_Alltoallv and gloo doing the same exchange, against the "
                "time one copy of the same payload bytes takes on this machine.",
                img_html(out_dir, figs.get("decode"), "decode"), [d["table"]]),
        section("shmem", "SHMEM",
                "Put, memcpy into the peer's mapping and MPI_Put between two ranks on two "
                "cores, both moving data at once, beside this report's local copy rate.",
                img_html(out_dir, figs.get("shmem"), "shmem"), [sh["table"], sh["latency"]]),
        "<h2 id='method'>Method</h2><ul>"
        "<li>Compute peak: the built-in probe of <code>bench gemm</code> (register-only "
        "loops of the best BF16 unit, one thread), times the cores used.</li>"
        "<li>Copy rate: <code>numpy.copyto</code> between buffers, one process pinned per "
        "core; the memory roof counts read + write (2× the bytes copied).</li>"
        "<li>GEMM traffic: every operand once (A, B bf16, C fp32). Layer: FLOPs 18·H·I per "
        "(token, choice) over the job; traffic 2 bytes × (4NH + 4NKH + 4NKI + 9EHI) for N "
        "tokens in the job: tokens and their gradients, dispatched/combined rows both ways, "
        "the saved intermediate written and read, weights read twice and gradients written "
        "once.</li>"
        "<li>Layer times: the slowest rank's median of timed iterations after a warm-up "
        "(<code>bench layer</code>); % of peak uses the cores the job ran on "
        "(ranks × workers, at most the machine's cores).</li>"
        "<li>Copy once (decode): payload bytes per rank (every (token, expert) row moved, as "
        "<code>bench dispatch</code> counts them) at the measured copy rate for that size "
        "with every core copying.</li></ul>",
        "</body></html>",
    ]
    return "\n".join(head + body)
