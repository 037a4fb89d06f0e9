"""`megamoe bench serve --small` runs (the three implementations, every quantisation, decode sizes)
and prints rows with the fields the issue asks for: impl, quant, shape, tokens, hosts, ms,
floor_ms, over_floor; the fused and the unfused outputs agree."""
import json

from conftest import run_megamoe


def test_bench_serve_small(megamoe_bin):
    r = run_megamoe(["bench", "serve", "--small", "--iters", "1", "--warmup", "0",
                     "--tokens", "1,8", "--threads", "1"], timeout=600)
    assert r.returncode == 0, r.stderr[-4000:]
    rows = json.loads(r.stdout)["rows"]
    probe = [x for x in rows if x["impl"] == "probe"]
    assert len(probe) == 1 and probe[0]["read_gbs_per_core"] > 0
    impls = ("mega_moe", "unfused", "unfused_gmm")
    runs = [x for x in rows if x["impl"] in impls]
    assert {(x["impl"], x["quant"], x["tokens"]) for x in runs} == {
        (i, q, t) for i in impls for q in ("bf16", "w8a8", "w4a8") for t in (1, 8)}
    for x in runs:
        for key in ("shape", "hosts", "ms", "floor_ms", "over_floor"):
            assert key in x, x
        assert x["ms"] > 0 and x["floor_ms"] > 0 and x["hosts"] == 1
        assert x["cpu_ms"] > 0, x
        if x["impl"] == "mega_moe":
            for other in ("unfused", "unfused_gmm") + (("bf16",) if x["quant"] != "bf16" else ()):
                assert x["speedup_vs_" + other] > 0, x
            for other in ("unfused", "unfused_gmm"):
                assert x["vs_" + other + "_rel_l2"] < (0.01 if x["quant"] == "bf16" else 0.04), x
