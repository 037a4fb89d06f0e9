"""`megamoe bench companion --quick`: the caller blocks through megamoe.ops beside plain torch
run, every (block, phase, impl) row is there with its time, speedup and its distance to the
plain-torch result (the numbers are checked in the quiet window, not here)."""
import json

from conftest import run_megamoe


def test_bench_companion_quick_rows(megamoe_bin):
    r = run_megamoe(["bench", "companion", "--quick", "--block", "mc2_w8a8,mc2_bf16"],
                    env_extra={"MEGAMOE_LOG_LEVEL": "warn"}, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    rows = json.loads(r.stdout)["rows"]
    got = {(x["block"], x["phase"], x["impl"]) for x in rows}
    for block in ("mc2_w8a8", "mc2_bf16"):
        for phase in ("decode", "prefill"):
            for impl in ("megamoe", "torch", "torch_gloo"):
                assert (block, phase, impl) in got, (block, phase, impl, sorted(got))
    for x in rows:
        assert x["ms"] > 0 and x["speedup_vs_torch"] > 0, x
        # int8 weights and activations land within a few percent of the bf16 loop
        assert x["rel_l2_vs_torch"] < (0.05 if x["block"] == "mc2_w8a8" else 0.02), x
    assert "Target (issue 28)" in r.stderr
