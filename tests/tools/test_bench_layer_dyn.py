"""`megamoe bench layer --tokens-dist` (per-call token counts, docs/moe.md "Dynamic tokens"):
rows carry the distribution, the dynamic layer's and the fixed layer's times, the time per
token of both, and the floor of small calls; the targets' table names both targets. Tiny
settings (seconds): it checks the benchmark works, not the numbers (a quiet machine does)."""
import json

from conftest import run_megamoe


def test_token_distribution_rows_and_targets(megamoe_bin):
    r = run_megamoe(["bench", "layer", "--shapes", "seed", "--workers", "1", "--routing",
                     "balanced", "--tokens-dist", "uniform:1-64", "--tokens-dist", "512",
                     "--iters", "3", "--warmup", "1", "--torch", "no"], timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    rows = json.loads(r.stdout)["rows"]
    assert [row["tokens_dist"] for row in rows] == ["uniform:1-64", "512"]
    small, big = rows
    for row in rows:
        assert row["schedule"] == "O1" and row["ep"] == 2
        for key in ("fwd_ms", "bwd_ms", "fwd_bwd_ms", "fixed_fwd_ms", "us_per_token",
                    "fixed_us_per_token", "floor_ms", "copy_ms", "rtt_us", "work_floor_ms"):
            assert row[key] > 0, (key, row)
        assert row["floor_ms"] >= row["copy_ms"]
    assert small["t_cap"] == 64 and 1 <= small["tokens_mean"] <= 64
    assert small["fixed_tokens"] == 128  # the padded layer a fixed T forces
    assert big["t_cap"] == 512 and big["tokens_mean"] == 512 and big["fixed_tokens"] == 512
    assert "time/token vs fixed T=512" in r.stderr
    assert "fwd / (copy + 2 rtt)" in r.stderr
