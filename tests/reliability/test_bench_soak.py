"""`megamoe bench soak` rows and `megamoe bench layer`'s memory figures (docs/reliability.md)."""
import json

from conftest import run_megamoe


def test_soak_rows_and_summary(megamoe_bin):
    r = run_megamoe(["bench", "soak", "--iters", "25", "--samples", "5", "--check-fds"],
                    timeout=300)
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["bench"] == "soak"
    samples = [row for row in doc["rows"] if "iter" in row]
    for rank in (0, 1):
        mine = [row for row in samples if row["rank"] == rank]
        assert [row["iter"] for row in mine] == [1, 6, 11, 16, 21, 25]
        for row in mine:
            assert set(row) == {"iter", "rank", "rss_mb", "fds", "rss_anon_mb", "rss_shmem_mb"}
            assert row["rss_mb"] > 1 and row["fds"] >= 3
    per_rank = [row for row in doc["rows"] if "rank" in row and "rss_growth_pct" in row]
    assert sorted(row["rank"] for row in per_rank) == [0, 1]
    job = [row for row in doc["rows"] if row.get("summary") == "job"]
    assert len(job) == 1
    assert job[0]["fd_growth"] == 0 and job[0]["fd_target_met"] is True
    assert job[0]["rss_growth_pct"] == max(row["rss_growth_pct"] for row in per_rank)
    assert "descriptor growth 0" in r.stderr


def test_soak_usage_errors(megamoe_bin):
    r = run_megamoe(["bench", "soak", "--samples", "1"])
    assert r.returncode == 2 and "--samples" in r.stderr
    r = run_megamoe(["bench", "soak", "--bogus"])
    assert r.returncode == 2 and "unknown option" in r.stderr


def test_layer_reports_memory(megamoe_bin):
    r = run_megamoe(["bench", "layer", "--shapes", "seed", "--workers", "1", "--routing", "single",
                     "--torch", "no", "--iters", "1", "--warmup", "0", "--profile-variant", "no"],
                    timeout=300)
    assert r.returncode == 0, r.stderr
    rows = json.loads(r.stdout)["rows"]
    assert rows
    for row in rows:
        assert 0 < row["heap_alloc_peak_mb"] <= row["heap_reserved_mb"]
        assert 0 < row["heap_touched_mb"] <= row["heap_reserved_mb"]
        assert row["peak_rss_mb"] > row["heap_touched_mb"] / 2
        ranks = dict(kv.split("=") for kv in row["peak_rss_mb_ranks"].split())
        assert set(ranks) == {"r0", "r1"}
        assert abs(max(float(v) for v in ranks.values()) - row["peak_rss_mb"]) <= 1
