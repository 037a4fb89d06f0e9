"""`megamoe trace merge|summary|svg` on traces made through the C API: valid Chrome JSON with
the required fields, merge of several ranks on one axis, summary numbers against an
independent computation, a well-formed SVG, escaping, and clear errors for bad input."""
import collections
import json
import os
import sys
import xml.etree.ElementTree as ET

import pytest

sys.path.insert(0, os.path.dirname(__file__))
from conftest import run_megamoe  # noqa: E402
from trace_synth import STAGES, load, records, write_rank_trace  # noqa: E402

from megamoe import profiler  # noqa: E402


@pytest.fixture
def rank_dir(tmp_path):
    d = tmp_path / "traces"
    d.mkdir()
    for r in range(3):
        write_rank_trace(d / f"trace_{r}.json", r, invocations=2, tasks=3, n_cube=2, n_vector=1)
    return d


def test_export_is_valid_chrome_json_with_required_fields(rank_dir):
    t = load(rank_dir / "trace_1.json")
    meta = t["megaKernelTrace"]
    assert meta["schemaVersion"] == 1
    assert meta["rank"] == 1
    assert meta["invocationCount"] == 2
    assert meta["recordCount"] == 2 * 3 * 3 * 3
    assert meta["droppedRecordCount"] == 0
    assert meta["warnings"] == []
    assert [i["direction"] for i in meta["invocations"]] == ["forward", "backward"]
    names = {e["tid"]: e["args"]["name"] for e in t["traceEvents"]
             if e.get("ph") == "M" and e["name"] == "thread_name"}
    assert sorted(names.values()) == ["cube 0", "cube 1", "launch", "vector 0"]
    procs = [e["args"]["name"] for e in t["traceEvents"]
             if e.get("ph") == "M" and e["name"] == "process_name"]
    assert procs == ["rank 1"]
    recs = records(t)
    assert len(recs) == meta["recordCount"]
    for e in recs:
        assert e["ph"] == "X" and e["pid"] == 1
        assert isinstance(e["ts"], float) and isinstance(e["dur"], float)
        a = e["args"]
        assert e["name"] == f"{a['stage']}:{a['kind']}"
        assert a["stage"] in STAGES and a["kind"] in ("wait", "compute", "signal")
        assert a["direction"] in ("forward", "backward")
        for k in ("task", "owner", "peer", "invocation"):
            assert isinstance(a[k], int)
        assert a["peer"] >= -1
    launches = [e for e in t["traceEvents"] if e.get("cat") == "MegaKernelLaunch"]
    assert [e["name"] for e in launches] == ["forward #0", "backward #1"]


def test_spans_do_not_overlap_per_track(rank_dir):
    t = load(rank_dir / "trace_0.json")
    by_track = collections.defaultdict(list)
    for e in records(t):
        ts, dur = round(e["ts"] * 1000), round(e["dur"] * 1000)  # exact ns
        by_track[(e["pid"], e["tid"])].append((ts, ts + dur))
    assert len(by_track) == 3
    for spans in by_track.values():
        spans.sort()
        for (s0, e0), (s1, _) in zip(spans, spans[1:]):
            assert e0 <= s1


def test_merge_puts_every_rank_on_one_axis(rank_dir, tmp_path):
    out = tmp_path / "merged.json"
    r = run_megamoe(["trace", "merge", str(rank_dir), "-o", str(out)])
    assert r.returncode == 0, r.stderr
    m = load(out)
    assert m["megaKernelTrace"]["merged"] is True
    assert m["megaKernelTrace"]["rank"] is None
    assert [x["rank"] for x in m["megaKernelTrace"]["ranks"]] == [0, 1, 2]
    assert m["megaKernelTrace"]["recordCount"] == 3 * 54
    ins = []
    for rnk in range(3):
        ins += [(e["pid"], e["ts"], e["dur"], e["name"]) for e in records(load(rank_dir / f"trace_{rnk}.json"))]
    outs = [(e["pid"], e["ts"], e["dur"], e["name"]) for e in records(m)]
    assert sorted(ins) == sorted(outs)  # same stamps: one time axis, nothing re-based
    # Files listed one by one give the same result.
    out2 = tmp_path / "merged2.json"
    files = [str(rank_dir / f"trace_{i}.json") for i in (2, 0, 1)]
    r = run_megamoe(["trace", "merge", *files, "-o", str(out2)])
    assert r.returncode == 0, r.stderr
    assert sorted((e["pid"], e["ts"]) for e in records(load(out2))) == sorted(
        (e[0], e[1]) for e in ins)


def _expected_stats(trace_paths):
    """Per (rank, role, stage, kind): durations in ns, computed here from the JSON."""
    stats = collections.defaultdict(list)
    launch = collections.Counter()
    for p in trace_paths:
        t = load(p)
        roles = {(e["pid"], e["tid"]): e["args"]["role"] for e in t["traceEvents"]
                 if e.get("ph") == "M" and e["name"] == "thread_name"}
        for e in records(t):
            a = e["args"]
            key = (e["pid"], roles[(e["pid"], e["tid"])], a["stage"], a["kind"])
            stats[key].append(round(e["dur"] * 1000))
        for inv in t["megaKernelTrace"]["invocations"]:
            launch[inv["rank"]] += round(inv["dur"] * 1000)
    return stats, launch


def test_summary_json_matches_an_independent_computation(rank_dir):
    r = run_megamoe(["trace", "summary", str(rank_dir), "--json"])
    assert r.returncode == 0, r.stderr
    s = json.loads(r.stdout)
    stats, launch = _expected_stats(sorted(rank_dir.glob("trace_*.json")))
    seen = 0
    for rank in s["ranks"]:
        assert rank["launchNs"] == launch[rank["rank"]]
        workers = collections.Counter(w["role"] for w in rank["workers"])
        assert workers == {"cube": 2, "vector": 1}
        for row in rank["stages"]:
            d = sorted(stats[(rank["rank"], row["role"], row["stage"], row["kind"])])
            n = len(d)
            assert row["count"] == n
            assert row["totalNs"] == sum(d)
            assert row["meanNs"] == sum(d) // n
            assert row["p50Ns"] == d[max(0, -(-n * 50 // 100) - 1)]
            assert row["p99Ns"] == d[max(0, -(-n * 99 // 100) - 1)]
            share = sum(d) / (launch[rank["rank"]] * workers[row["role"]])
            assert abs(row["share"] - share) < 2e-6
            seen += 1
        for w in rank["workers"]:
            assert abs(w["waitShare"] - w["waitNs"] / w["launchNs"]) < 2e-6
    assert seen == len(stats)


def test_summary_table_and_svg(rank_dir, tmp_path):
    svg = tmp_path / "timeline.svg"
    r = run_megamoe(["trace", "summary", str(rank_dir), "--svg", str(svg), "--width", "1000"])
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert out.startswith("MegaKernel trace: 3 ranks, 6 invocations, 162 records, 0 dropped")
    for rank in range(3):
        assert f"rank {rank} (host " in out
    assert "cube (2 workers)" in out and "vector (1 worker)" in out
    assert "p50 us" in out and "p99 us" in out and "share" in out
    assert "no warnings" in out
    root = ET.parse(svg).getroot()
    assert root.tag == "{http://www.w3.org/2000/svg}svg"
    assert root.get("width") == "1000"
    ns = {"s": "http://www.w3.org/2000/svg"}
    texts = [t.text for t in root.iter("{http://www.w3.org/2000/svg}text")]
    assert texts.count("cube 0") == 3 and texts.count("vector 0") == 3
    assert "rank 2" in texts and "wait (any stage)" in texts
    assert root.find(".//s:pattern[@id='wait']", ns) is not None
    rects = root.findall("s:rect", ns)[1:]  # spans, invocations, legend (after the background)
    assert sum(1 for x in rects if x.get("fill") == "url(#wait)") > 3
    for x in rects:
        assert float(x.get("width")) > 0 and 0 <= float(x.get("x")) <= 1000


def test_svg_of_one_invocation(rank_dir, tmp_path):
    svg = tmp_path / "inv1.svg"
    r = run_megamoe(["trace", "svg", str(rank_dir), "-o", str(svg), "--invocation", "1"])
    assert r.returncode == 0, r.stderr
    titles = [t.text for t in ET.parse(svg).getroot().iter("{http://www.w3.org/2000/svg}title")]
    assert "backward #1" in titles and "forward #0" not in titles
    r = run_megamoe(["trace", "svg", str(rank_dir), "-o", str(svg), "--invocation", "9"])
    assert r.returncode == 1
    assert "invocation 9 is not in the trace" in r.stderr


def test_names_are_escaped_everywhere(tmp_path):
    odd = ['q"uote\\', "new\nline", "</svg>&<b>", "caf\u00e9 \u4e2d", "tab\there"]
    p = tmp_path / "trace_0.json"
    write_rank_trace(p, 0, invocations=1, tasks=2, stages=odd)
    t = load(p)
    assert {e["args"]["stage"] for e in records(t)} <= set(odd)
    svg = tmp_path / "odd.svg"
    profiler.render_svg([str(p)], str(svg))
    texts = [x.text for x in ET.parse(svg).getroot().iter("{http://www.w3.org/2000/svg}text")]
    assert "</svg>&<b>" in texts or 'q"uote\\' in texts
    merged = tmp_path / "m.json"
    profiler.merge_traces([str(p)], str(merged))
    assert {e["args"]["stage"] for e in records(load(merged))} <= set(odd)


@pytest.mark.parametrize("text,want", [
    ('{"traceEvents": [', ":1:"),
    ("\x00\x01garbage", "malformed JSON"),
    ('{"traceEvents": []}', "not a MegaKernel trace"),
    ('[1, 2, 3]', "not one"),
    ('{"traceEvents":[],"megaKernelTrace":{"schemaVersion":7}}', "schemaVersion"),
])
def test_malformed_trace_is_a_clear_error(tmp_path, text, want):
    p = tmp_path / "trace_0.json"
    p.write_bytes(text.encode("latin-1"))
    for args in (["merge", str(p), "-o", str(tmp_path / "m.json")], ["summary", str(p)],
                 ["svg", str(p), "-o", str(tmp_path / "x.svg")]):
        r = run_megamoe(["trace", *args])
        assert r.returncode == 1, (args, r.stdout, r.stderr)
        assert want in r.stderr and "trace_0.json" in r.stderr, r.stderr
    assert not (tmp_path / "m.json").exists() and not (tmp_path / "x.svg").exists()


def test_missing_inputs_and_usage_errors(tmp_path):
    r = run_megamoe(["trace", "summary", str(tmp_path / "nope.json")])
    assert r.returncode == 1 and "nope.json" in r.stderr
    r = run_megamoe(["trace", "summary", str(tmp_path)])
    assert r.returncode == 1 and "holds no trace_<rank>.json" in r.stderr
    assert run_megamoe(["trace", "merge", str(tmp_path)]).returncode == 2  # no -o
    assert run_megamoe(["trace", "summary"]).returncode == 2
    assert run_megamoe(["trace", "frobnicate", "x"]).returncode == 2
    assert run_megamoe(["trace", "summary", "x", "--bogus"]).returncode == 2
    assert run_megamoe(["trace", "svg", "x", "-o", "y.svg", "--width", "5"]).returncode == 2
    r = run_megamoe(["trace", "--help"])
    assert r.returncode == 0 and "merge" in r.stdout and "summary" in r.stdout
