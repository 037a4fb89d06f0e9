"""`megamoe bench serve --small` runs (the three implementations, every quantisation, decode sizes)
and prints rows with the fields the issue asks for: impl, quant, shape, tokens, hosts, ms,
floor_ms, over_floor; the fused and the unfused outputs agree."""
import json
import os

import pytest

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
        assert x["sys_ms"] >= 0 and x["minflt"] >= 0, x
        if x["impl"] == "mega_moe":
            for other in ("unfused", "unfused_gmm") + (("bf16",) if x["quant"] != "bf16" else ()):
                assert x["speedup_vs_" + other] > 0, x
            bound = 0.01 if x["quant"] == "bf16" else 0.04
            # where torch accumulates bf16 matmuls in bf16 (torch 1.13 below AVX-512) the bound
            # holds for the unfused path's fp32-accumulated form (torch's result with AVX-512);
            # its own output is 2-4 % from that form (unfused_vs_fp32acc_rel_l2)
            unfused = "unfused_fp32acc" if x["torch_bf16_accumulates_in_bf16"] else "unfused"
            for other in (unfused, "unfused_gmm"):
                assert x["vs_" + other + "_rel_l2"] < bound, x
        # the floor's parts, and the read rate probed beside the calls (one thread per rank)
        assert x["floor_ms"] >= max(x["floor_mem_ms"], x["floor_compute_ms"]) > 0, x
        assert x["read_gbs_beside"] > 0 and x["read_one_gbs_beside"] > 0, x
    assert probe[0]["read_gbs_one_core"] > 0
    # an INT8 unit (VNNI or AMX) has a probed peak; an AVX2 CPU has none and says so
    assert (probe[0]["int8_peak_gops_per_core"] > 0) == (probe[0]["int8_unit"] != "none"), probe


@pytest.mark.skipif(os.geteuid() != 0, reason="simulated hosts are network namespaces: root")
def test_bench_serve_hosts_pairs_one_host_and_two_hosts_call_by_call():
    """--hosts 2 (2 ranks): one job of 4 ranks runs the one-host group and the two-host group
    call by call; every two-host row carries its one-host twin's ms and the wire fields."""
    r = run_megamoe(["bench", "serve", "--small", "--hosts", "2", "--impl", "mega_moe",
                     "--quant", "bf16,w8a8", "--iters", "2", "--warmup", "1", "--tokens", "1,8"],
                    timeout=600)
    assert r.returncode == 0, r.stderr[-4000:]
    rows = [x for x in json.loads(r.stdout)["rows"] if x["impl"] == "mega_moe"]
    one = {(x["quant"], x["tokens"]): x for x in rows if x["hosts"] == 1}
    two = {(x["quant"], x["tokens"]): x for x in rows if x["hosts"] == 2}
    assert set(one) == set(two) == {(q, t) for q in ("bf16", "w8a8") for t in (1, 8)}
    for key, x in two.items():
        assert x["ms_one_host"] == one[key]["ms"] and x["ms"] > 0, x
        assert x["bytes_to_other_hosts"] > 0 and x["wire_floor_ms"] > 0, x
        # the time over one host: the median of the per-iteration differences (paired)
        assert x["extra_ms_q1"] <= x["extra_ms"] <= x["extra_ms_q3"], x
        assert abs(x["over_wire_floor"] - x["extra_ms"] / x["wire_floor_ms"]) \
            < 1e-3 * max(1.0, abs(x["over_wire_floor"])), x


def test_bench_serve_between_runs_its_action_before_each_fused_call():
    """--between spin:MS busy-waits before every timed fused call (outside its time), stream:MB
    reads an array, fault:MB maps, touches and unmaps fresh pages; anything else is refused
    with the accepted forms."""
    for spec in ("spin:300", "stream:8", "fault:64"):
        r = run_megamoe(["bench", "serve", "--small", "--impl", "mega_moe", "--quant", "bf16",
                         "--tokens", "1", "--iters", "2", "--warmup", "0", "--threads", "1",
                         "--between", spec], timeout=600)
        assert r.returncode == 0, r.stderr[-4000:]
        (row,) = [x for x in json.loads(r.stdout)["rows"] if x["impl"] == "mega_moe"]
        assert 0 < row["ms"] < 300, row  # the spin is not part of the call's time
    r = run_megamoe(["bench", "serve", "--small", "--impl", "mega_moe", "--quant", "bf16",
                     "--tokens", "1", "--iters", "1", "--between", "nap:3"], timeout=600)
    assert r.returncode != 0 and "expected spin:MS, stream:MB or fault:MB" in r.stderr, r.stderr[-2000:]
