"""`megamoe bench layer`: training-step rows beside the frozen ones (weights changed every step,
re-pack included), pct_peak against the probed peak, and the PyTorch baseline's output checked
against megamoe's on every rank. Tiny settings: it checks the rows, not the numbers."""
import json

from conftest import run_megamoe


def test_training_step_rows_and_the_torch_comparison(megamoe_bin):
    r = run_megamoe(["bench", "layer", "--shapes", "seed", "--workers", "1", "--routing",
                     "balanced", "--iters", "2", "--warmup", "1", "--schedule", "O0,O1"],
                    timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    rows = json.loads(r.stdout)["rows"]
    mm = {row["schedule"]: row for row in rows if row["impl"] == "megamoe"}
    assert {"O0", "O1", "O0+step", "O1+step"} <= set(mm), sorted(mm)
    for name, row in mm.items():
        assert row["training_step"] is ("+step" in name), row
        assert row["fwd_bwd_ms"] > 0 and 0 < row["pct_peak"] < 100, row
    torch_row = next(row for row in rows if row["impl"] == "torch")
    assert torch_row["same_output_as_megamoe"] is True, torch_row
    assert 0 <= torch_row["output_rel_l2_vs_megamoe"] <= 0.01


def test_training_steps_can_be_left_out(megamoe_bin):
    r = run_megamoe(["bench", "layer", "--shapes", "seed", "--workers", "1", "--routing",
                     "skew", "--iters", "1", "--warmup", "0", "--torch", "no",
                     "--training-step", "no", "--no-probe"], timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    rows = json.loads(r.stdout)["rows"]
    assert rows and all(row["training_step"] is False and row["pct_peak"] is None
                        for row in rows)
