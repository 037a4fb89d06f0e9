"""`megamoe bench report`: the page and its PNGs from the JSON of tiny runs of the real
benchmarks (--from; seconds), usage errors, the installed layout, and — marked report_quick,
run by `make test-report` (minutes, so not in `make test`) — one real `--quick` run."""
import base64
import json
import os
import re
import shutil
import struct
import subprocess
import sys

import pytest

from conftest import BUILD, MEGAMOE, REPO, run_megamoe

sys.path.insert(0, os.path.join(REPO, "bench"))
from report_sections import fmt  # noqa: E402  (the page's own number format)

FIGURES = ["roofline.png", "tokens.png", "scaling.png", "skew.png", "decode.png", "shmem.png"]
# simulated hosts need root (network namespaces) and a megamoe with bench layer --hosts
HOSTS = os.geteuid() == 0 and "--hosts" in subprocess.run(
    [MEGAMOE, "bench", "layer", "--help"], capture_output=True, text=True).stdout \
    if os.path.exists(MEGAMOE) else False
LAYER_TINY = ["--shapes", "seed", "--workers", "1", "--schedule", "O1", "--iters", "1",
              "--warmup", "0", "--profile-variant", "no"]


def _bench(args, timeout=300):
    r = run_megamoe(["bench"] + args, timeout=timeout)
    assert r.returncode == 0, (args, r.stderr[-3000:])
    doc = json.loads(r.stdout)
    assert doc["rows"], args
    return r.stdout


@pytest.fixture(scope="module")
def bench_json(tmp_path_factory, megamoe_bin):
    """A --from directory made by the benchmarks themselves, at their smallest settings."""
    d = tmp_path_factory.mktemp("bench_json")
    files = {
        "gemm": [["gemm", "--quick", "--shape", "seed_gmm2"]],
        "shmem": [["shmem", "--quick"]],
        "dispatch": [["dispatch", "--bs", "8,64", "--quant", "0", "--reps", "2",
                      "--zero-fill-only", "--no-gloo"]],
        "layer": [["layer", "--tokens", "128", "--routing", "balanced,skew", "--torch", "no"]
                  + LAYER_TINY],
        "tokens": [["layer", "--tokens", "128,256", "--routing", "balanced", "--torch", "yes"]
                   + LAYER_TINY],
        "scaling": [["layer", "--tokens", "256", "--ranks", "1", "--routing", "balanced",
                     "--torch", "no"] + LAYER_TINY,
                    ["layer", "--tokens", "128", "--ranks", "2", "--routing", "balanced",
                     "--torch", "no"] + LAYER_TINY],
    }
    if HOSTS:  # 2 ranks on 2 simulated hosts (megamoe launch --hosts), when this user may
        files["scaling"].append(["layer", "--tokens", "128", "--ranks", "2", "--hosts", "2",
                                 "--routing", "balanced", "--torch", "no"] + LAYER_TINY)
    for name, runs in files.items():
        with open(d / f"{name}.json", "w") as f:
            for args in runs:  # several runs of one step are appended
                f.write(_bench(args))
    return d


def _png_size(data):
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    w, h = struct.unpack(">II", data[16:24])
    return w, h


def check_page(out, expect_rows=None):
    """The page, every figure (a real PNG, inlined into the page byte for byte) and tables."""
    page = (out / "report.html").read_text()
    assert len(page) > 20000 and page.startswith("<!DOCTYPE html>") and "</html>" in page
    assert "http://" not in page and "https://" not in page and "<script" not in page
    inlined = dict((m.group(2), m.group(1)) for m in re.finditer(
        r"src='data:image/png;base64,([A-Za-z0-9+/=]+)' alt='[^']*' data-file='([^']+)'", page))
    for name in FIGURES:
        data = (out / name).read_bytes()
        assert len(data) > 10000, name
        w, h = _png_size(data)
        assert w >= 600 and h >= 300, (name, w, h)
        assert name in inlined, f"{name} is not on the page"
        assert base64.b64decode(inlined[name]) == data, name
    tables = re.findall(r"<table>(.*?)</table>", page, re.S)
    assert len(tables) >= 9  # machine, versions, and one or more per figure
    for t in tables:
        assert t.count("<tr>") >= 2 if "<thead>" in t else t.count("<tr>") >= 1, t[:300]
    for sid in ("machine", "roofline", "tokens", "scaling", "skew", "decode", "shmem"):
        assert f"id='{sid}'" in page
    if expect_rows:
        for sid, n in expect_rows.items():
            sec = page.split(f"<h2 id='{sid}'>")[1].split("<h2 ")[0]
            body = re.findall(r"<tbody>(.*?)</tbody>", sec, re.S)[0]
            assert body.count("<tr>") == n, (sid, body.count("<tr>"), n)
    return page


def _rows(path, keep=lambda r: True):
    with open(path) as f:
        text = f.read()
    dec, i, out = json.JSONDecoder(), 0, []
    while i < len(text):
        if text[i].isspace():
            i += 1
            continue
        doc, i = dec.raw_decode(text, i)
        out += [r for r in doc["rows"] if keep(r)]
    return out


@pytest.fixture(scope="module")
def report_dir(bench_json, tmp_path_factory):
    """The page rendered from the benchmarks' JSON (this machine described, its copy rate
    measured, as no machine.json is there)."""
    out = tmp_path_factory.mktemp("report")
    r = run_megamoe(["bench", "report", "--from", str(bench_json), "--out", str(out)],
                    timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    return out


def test_report_from_bench_json(bench_json, report_dir):
    out = report_dir
    layer_rows = len(_rows(bench_json / "layer.json")) + len(_rows(bench_json / "tokens.json")) \
        + len(_rows(bench_json / "scaling.json"))
    page = check_page(out, {
        # every GEMM and layer row is a point of the roofline
        "roofline": len(_rows(bench_json / "gemm.json")) + layer_rows,
        "tokens": 2, "scaling": 3 if HOSTS else 2,
        "skew": 2, "decode": len(_rows(bench_json / "dispatch.json"))})
    # the numbers behind the figures are the benchmarks' own
    t128 = [r for r in _rows(bench_json / "tokens.json")
            if r["impl"] == "megamoe" and r["tokens"] == 128][0]
    tokens_sec = page.split("<h2 id='tokens'>")[1].split("<h2 ")[0]
    assert f"<td>128</td><td>{fmt(float(t128['fwd_bwd_ms']))}</td>" in tokens_sec
    assert "AMD" in page or "Intel" in page or "CPU" in page
    # rows that are not there are said to be missing, not hidden
    scaling = page.split("<h2 id='scaling'>")[1].split("<h2 ")[0]
    if HOSTS:
        assert "<tr><td>2</td><td>2</td><td>128</td>" in scaling  # 2 ranks on 2 hosts
        assert "not available" not in scaling and "EP2 2 hosts" in page
    else:
        assert "2 simulated hosts: not available" in scaling
    assert "expert replicas: not available" in page
    # the inputs are kept beside the page, so it can be rendered again from there
    for name in ("gemm", "shmem", "dispatch", "layer", "tokens", "scaling", "machine"):
        assert (out / "data" / f"{name}.json").stat().st_size > 100, name
    machine = json.loads((out / "data" / "machine.json").read_text())
    assert machine["copy"]["one_core_Bps"] > 1e8 and machine["cores"] >= 1


def test_report_missing_bench_is_named(report_dir, tmp_path):
    part = tmp_path / "part"
    part.mkdir()
    for name in ("gemm", "layer", "machine"):
        shutil.copy(report_dir / "data" / f"{name}.json", part)
    r = run_megamoe(["bench", "report", "--from", str(part), "--out", str(tmp_path / "o")],
                    timeout=300)
    assert r.returncode == 1, r.stderr[-2000:]  # written, but incomplete
    page = (tmp_path / "o" / "report.html").read_text()
    assert "dispatch: no benchmark output" in page and "no figure" in page
    assert "missing: tokens: no benchmark output" in r.stderr


def test_report_picks_up_replicas_rows(report_dir, tmp_path):
    """Rows carrying "replicas" (bench layer --replicas, not in this build yet) are drawn
    beside the routing patterns: real layer rows relabelled stand in for them (and for
    "hosts" rows when this user cannot make simulated hosts)."""
    d = tmp_path / "in"
    shutil.copytree(report_dir / "data", d)
    if not HOSTS:
        with open(d / "scaling.json") as f:
            doc = json.loads(f.read().splitlines()[-1])  # the 2-rank run
        for r in doc["rows"]:
            r["hosts"] = 2
        with open(d / "scaling.json", "a") as f:
            f.write(json.dumps(doc) + "\n")
    with open(d / "layer.json") as f:
        doc = json.loads(f.read().splitlines()[0])
    doc["rows"] = [dict(r, replicas=2) for r in doc["rows"] if r["routing"] == "skew"]
    with open(d / "layer.json", "a") as f:
        f.write(json.dumps(doc) + "\n")
    out = tmp_path / "o"
    r = run_megamoe(["bench", "report", "--from", str(d), "--out", str(out)], timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    page = check_page(out, {"scaling": 3, "skew": 3})
    scaling = page.split("<h2 id='scaling'>")[1].split("<h2 ")[0]
    assert "<tr><td>2</td><td>2</td><td>128</td>" in scaling  # 2 ranks on 2 hosts
    assert "not available" not in scaling
    skew = page.split("<h2 id='skew'>")[1].split("<h2 ")[0]
    assert "skew + 2 replicas" in skew and "not available" not in skew
    assert "EP2 2 hosts" in page and "replicas 2" in page  # roofline points


@pytest.mark.parametrize("args,message", [
    ([], "--out"),
    (["--out", "/tmp/x", "--from", "/nonexistent/dir"], "no such directory"),
    (["--out", "/tmp/x", "--bogus"], "unrecognized arguments"),
])
def test_report_usage_errors(megamoe_bin, args, message):
    r = run_megamoe(["bench", "report"] + args, timeout=60)
    assert r.returncode == 2, (r.returncode, r.stderr)
    assert message in r.stderr


def test_report_not_json_is_a_usage_error(tmp_path, megamoe_bin):
    (tmp_path / "gemm.json").write_text("not json")
    r = run_megamoe(["bench", "report", "--from", str(tmp_path), "--out", str(tmp_path / "o")])
    assert r.returncode == 2 and "gemm.json is not benchmark JSON" in r.stderr


def test_report_is_listed(megamoe_bin):
    r = run_megamoe(["bench", "list"])
    assert r.returncode == 0 and re.search(r"^\s+report\s", r.stdout, re.M)
    r = run_megamoe(["bench", "report", "--help"])
    assert r.returncode == 0 and "--quick" in r.stdout and "--from" in r.stdout


def test_installed_cli_finds_the_report_script(report_dir, tmp_path):
    """cmake --install puts the scripts in <prefix>/share/megamoe/bench, where an installed
    CLI looks first (no source tree above it); it renders a previous report directory again."""
    prefix = tmp_path / "prefix"
    subprocess.run(["cmake", "--install", BUILD, "--prefix", str(prefix)], check=True,
                   capture_output=True, timeout=120)
    data = prefix / "share" / "megamoe" / "bench"
    for name in ("report.py", "report_plots.py", "torch_moe_layer.py"):
        assert (data / name).is_file(), name
    cli = prefix / "bin" / "megamoe"
    if not cli.exists():  # the CLI's own install rule may not be there yet
        cli.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(MEGAMOE, cli)
    r = subprocess.run([str(cli), "bench", "report", "--from", str(report_dir), "--out",
                        str(tmp_path / "o")], cwd=str(tmp_path), capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "measuring" not in r.stderr  # the saved machine record is used
    check_page(tmp_path / "o")
    assert (tmp_path / "o" / "data" / "machine.json").read_text() == \
        (report_dir / "data" / "machine.json").read_text()
    assert REPO not in str(data)


@pytest.mark.report_quick
def test_report_quick_real_run(tmp_path, megamoe_bin):
    """One real `megamoe bench report --quick` (a few minutes): every benchmark and sweep."""
    out = tmp_path / "quick"
    r = run_megamoe(["bench", "report", "--quick", "--out", str(out)], timeout=1800)
    assert r.returncode == 0, r.stderr[-4000:]
    check_page(out)
    machine = json.loads((out / "data" / "machine.json").read_text())
    assert machine["quick"] and machine["copy"]["one_core_Bps"] > 1e8
    tokens = {r["tokens"] for r in _rows(out / "data" / "tokens.json")}
    assert tokens == {128, 512, 2048}
    ranks = {r["ep"] for r in _rows(out / "data" / "scaling.json")}
    assert {1, 2, 4} <= ranks
    for name in ("gemm", "shmem", "dispatch", "layer", "tokens", "scaling"):
        assert (out / "logs" / f"{name}.log").stat().st_size > 0
