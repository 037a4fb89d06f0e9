"""`megamoe run` (the main job): a small verified run, shape rules checked before any rank
starts (usage errors exit 2 naming the rule), and a capacity overflow exits 1."""
import pytest

from conftest import run_megamoe

SMALL = ["--tokens", "128", "--hidden", "64", "--intermediate", "32", "--experts", "4",
         "--top-k", "2", "--iters", "1", "--warmup", "0", "--timeout", "120"]


def test_small_run_is_verified(megamoe_bin):
    r = run_megamoe(["run"] + SMALL, timeout=180)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "PASSED" in r.stdout


@pytest.mark.parametrize("args,rule", [
    (["--ranks", "3"], "multiple of --ranks"),
    (["--top-k", "5"], "--top-k"),
    (["--tokens", "200"], "multiple of 128"),
    (["--capacity-factor", "0.5"], "--capacity-factor"),
    (["--schedule", "O2"], "--schedule"),
    (["--schedule", "O0,O1"], "--schedule"),
    (["--dispatch-mode", "sideways"], "--dispatch-mode"),
    (["--dispatch-mode", "pull", "--capacity-growth-factor", "2"], "need --dispatch-mode push"),
    (["--dispatch-mode", "push", "--capacity-factor", "2"], "cannot be combined"),
])
def test_invalid_shapes_are_usage_errors(megamoe_bin, args, rule):
    r = run_megamoe(["run"] + SMALL + args, timeout=60)
    assert r.returncode == 2, (r.returncode, r.stdout[-2000:], r.stderr[-2000:])
    assert rule in r.stderr
    assert "[rank" not in r.stderr  # refused before any rank started


@pytest.mark.parametrize("mode", [["--dispatch-mode", "pull"],
                                  ["--dispatch-mode", "push", "--initial-capacity-factor", "1",
                                   "--routing", "single"]])
def test_dispatch_modes_are_verified(megamoe_bin, mode):
    # push from 1 x T*K must grow for "single" routing (no overflow error), pull fetches rows
    r = run_megamoe(["run"] + SMALL + mode, timeout=180)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "PASSED" in r.stdout
    assert mode[1] in r.stdout  # the capacity line names the mode


def test_capacity_overflow_fails_with_status_1(megamoe_bin):
    r = run_megamoe(["run"] + SMALL + ["--capacity-factor", "1", "--routing", "single"],
                    timeout=180)
    assert r.returncode == 1, (r.returncode, r.stdout[-2000:], r.stderr[-2000:])
    assert "CAPACITY_OVERFLOW" in r.stderr


def test_per_call_token_counts_are_verified(megamoe_bin):
    """--max-tokens: a max_local_num_tokens layer; the counts of every rank and call come from
    --tokens-dist (here 0 on one rank, 129 on the other, then swapped); the first call is
    verified against the reference."""
    args = [a for a in SMALL if a not in ("--tokens", "128")]
    r = run_megamoe(["run"] + args + ["--max-tokens", "200", "--tokens-dist", "list:0,129",
                                      "--iters", "2", "--schedule", "O0"], timeout=180)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "T_cap=200 (per-call counts list:0,129)" in r.stdout
    assert "tokens per call (mean of the timed calls): 64.5 per rank" in r.stdout
    assert "PASSED" in r.stdout


@pytest.mark.parametrize("args,rule", [
    (["--tokens-dist", "uniform:1-9"], "--tokens-dist needs --max-tokens"),
    (["--max-tokens", "100", "--tokens-dist", "uniform:1-101"], "more than --max-tokens"),
    (["--max-tokens", "100", "--tokens-dist", "sometimes"], "not a token-count distribution"),
])
def test_per_call_count_options_are_checked(megamoe_bin, args, rule):
    r = run_megamoe(["run"] + SMALL + args, timeout=60)
    assert r.returncode == 2, (r.returncode, r.stdout[-2000:], r.stderr[-2000:])
    assert rule in r.stderr
