"""`megamoe bench gemm` quantised and decode rows: a tiny run (no probes, one weight set, few
calls) has the rows and fields issue 25 asks for, and the probes object; the numbers are not
checked here (benchmarks, not tests, decide speed)."""
import json

from conftest import run_megamoe


def test_bench_gemm_quant_rows_and_fields(megamoe_bin):
    r = run_megamoe(["bench", "gemm", "--quick", "--shape", "dec_gmm2", "--weight-sets", "1",
                     "--seconds", "0.001", "--no-probe"], timeout=300)
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    probes = doc["probes"]
    for key in ("peak_int8_gops", "peak_bf16_gflops", "read_gbps", "llc_bytes"):
        assert key in probes
    assert set(probes["read_gbps"]) == {"1", "2"}
    rows = [x for x in doc["rows"] if x["impl"] == "decode"]
    # M = 1, 4, 8, 16 x bf16 / w8a8 / w4a8 x 1 and 2 threads
    assert len(rows) == 24
    assert {x["quant"] for x in rows} == {"bf16", "w8a8", "w4a8"}
    assert {x["M"] for x in rows} == {1, 4, 8, 16} and {x["threads"] for x in rows} == {1, 2}
    for x in rows:
        assert x["K"] == 1408 and x["N"] == 4096 and x["gflops"] > 0
        for key in ("pct_int8_peak", "pct_roofline", "weight_sets", "backend"):
            assert key in x
        assert x["weight_sets"] == 1
        if x["quant"] != "bf16":
            assert x["pct_peak"] is None  # "of the best BF16 unit" is not for int8 rows
    assert "quantised GEMM targets" in r.stderr
