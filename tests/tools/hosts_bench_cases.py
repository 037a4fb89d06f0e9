"""The benchmarks across simulated hosts (issue 12): `bench shmem --hosts 2` (megamoe's put
beside UCX's own put and a TCP stream), `bench engines` (the engine study), `bench dispatch
--hosts 2` (hierarchy beside MPI_Alltoallv). Quick modes only: the rows and their fields, not
the speeds (timings are checked by running the benchmarks, never by tests). Run by CTest
(label hosts)."""
import json
import os
import re
import subprocess

import pytest

from hosts_util import BUILD, MEGAMOE, needs_root

needs_mpi = pytest.mark.skipif(
    not os.path.exists(os.path.join(BUILD, "tests", "tools", "hosts_mpi_probe")),
    reason="built without MPI (MEGAMOE_WITH_MPI=OFF)")


def _bench(args, timeout=300):
    r = subprocess.run([MEGAMOE, "bench"] + args, capture_output=True, text=True, timeout=timeout)
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    return doc["rows"], r.stderr


@needs_root
@needs_mpi
def test_bench_shmem_across_hosts_puts_through_the_engine_beside_ucx_and_tcp():
    rows, err = _bench(["shmem", "--hosts", "2", "--quick", "--sizes", "64K,1M", "--trials", "2"])
    assert all(x["hosts"] == 2 for x in rows)
    for impl in ("put", "engine", "tcp_stream", "mpi_put"):
        got = {x["size_bytes"]: x for x in rows if x["impl"] == impl}
        assert sorted(got) == [64 << 10, 1 << 20], impl
        for x in got.values():
            assert x["GBps"] > 0 and x["GB_per_cpu_s"] > 0, x
    via = {x["impl"]: x["via"] for x in rows if "via" in x and "size_bytes" in x}
    assert via["put"].startswith("UCX ") and "ucp_put_nbx" in via["engine"]
    # megamoe's TCP segment sizes (engine_ucx.c), mirrored by the engine baseline
    assert "TCP segments 64k/256k" in via["put"] and "TCP segments 64k/256k" in via["engine"]
    assert "osc ucx" in via["mpi_put"]
    memcpy = [x for x in rows if x["impl"] == "memcpy"]
    assert len(memcpy) == 1 and memcpy[0]["GBps"] is None and "not mapped" in memcpy[0]["note"]
    for impl in ("signal_rtt", "engine_signal_rtt", "tcp_rtt", "barrier"):
        assert [x["us"] > 0 for x in rows if x["impl"] == impl] == [True], impl
    assert "put >= 0.9 x engine" in err
    # issue 31: the signal round trip beside the engine's own
    sig = [x for x in rows if x["impl"] == "signal_rtt"][0]
    eng = [x for x in rows if x["impl"] == "engine_signal_rtt"][0]
    assert abs(sig["over_engine"] - sig["us"] / eng["us"]) < 1e-3 * sig["over_engine"]
    assert "signal round trip <= 1.2 x the engine's own" in err


@needs_root
@needs_mpi
def test_bench_engines_quick_measures_every_candidate():
    rows, _ = _bench(["engines", "--quick"])
    bw = {(x["impl"], x.get("osc")) for x in rows if x["measure"] == "bandwidth"}
    # the second osc component: pt2pt, which Open MPI 5 no longer has (rdma there)
    ver = subprocess.run(["mpirun", "--version"], capture_output=True, text=True).stdout
    m = re.search(r"\(Open MPI\) (\d+)\.", ver)
    second = "rdma" if m and int(m.group(1)) >= 5 else "pt2pt"
    assert bw == {("ucx", None), ("mpi_rma", "ucx"), ("two_sided", "ucx"), ("megamoe", None),
                  ("mpi_rma", second)}, bw
    assert all(x["GBps"] > 0 for x in rows if x["measure"] == "bandwidth")
    rtt = {(x["impl"], x.get("osc")): x["us"] for x in rows if x["measure"] == "signal_rtt"}
    assert set(rtt) == bw and all(v > 0 for v in rtt.values())
    busy = {(x["impl"], x.get("osc")): x for x in rows if x["measure"] == "busy_target"}
    assert set(busy) == bw | {("none", None), ("ucx+thread", None)}
    assert busy[("none", None)]["target_gemms"] > 0
    for k, x in busy.items():
        if k[0] != "none":
            assert x["put_done_ms"] > 0 and x["put_idle_ms"] > 0 and x["size_bytes"] == 16 << 20


@needs_root
@needs_mpi
def test_bench_dispatch_across_hosts_runs_hierarchy_beside_mpi_alltoallv():
    rows, err = _bench(["dispatch", "--hosts", "2", "--bs", "128", "--quant", "0", "--reps", "1",
                        "--no-gloo", "--zero-fill-only"])
    got = sorted((x["impl"], x.get("comm_alg")) for x in rows)
    assert got == [("megamoe", "fullmesh_v1"), ("megamoe", "hierarchy"), ("mpi_alltoallv", None)]
    assert all(x["hosts"] == 2 and x["dispatch_us"] > 0 and x["combine_us"] > 0 for x in rows)
    assert "target across hosts >= 1.5x" in err
    # issue 31: what crossed hosts per dispatch + combine, and the wire floor behind the ratio
    for x in rows:
        if x["impl"] != "megamoe":
            assert "wire_floor_ms" not in x
            continue
        assert x["bytes_to_other_hosts"] > 0 and 0 < x["engine_messages"] < 200, x
        assert x["wire_floor_ms"] > 0
        ratio = (x["dispatch_us"] + x["combine_us"]) * 1e-3 / x["wire_floor_ms"]
        assert abs(x["over_wire_floor"] - ratio) < 1e-3 * ratio, x
    assert "over its wire floor" in err
