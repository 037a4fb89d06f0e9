"""`megamoe bench shmem`: the row format, and a killed rank ending the run with an error."""
import json
import os
import signal
import subprocess
import time

from conftest import MEGAMOE, run_megamoe


def test_bench_shmem_quick_rows(megamoe_bin):
    r = run_megamoe(["bench", "shmem", "--quick"], timeout=300)
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["bench"] == "shmem"
    rows = doc["rows"]
    sizes = sorted({row["size_bytes"] for row in rows if "size_bytes" in row})
    assert sizes == [64 << 10, 1 << 20, 4 << 20]
    for impl in ("put", "memcpy", "mpi_put"):
        got = {row["size_bytes"]: row for row in rows if row["impl"] == impl}
        assert sorted(got) == sizes, impl
        for row in got.values():
            assert set(row) == {"impl", "hosts", "size_bytes", "GBps"}
            assert row["GBps"] > 0 and row["hosts"] == 1
    rtt = [row for row in rows if row["impl"] == "signal_rtt"]
    bar = [row for row in rows if row["impl"] == "barrier"]
    assert len(rtt) == 1 and set(rtt[0]) == {"impl", "hosts", "us"} and rtt[0]["us"] > 0
    assert len(bar) == 1 and bar[0]["ranks"] == 2 and bar[0]["us"] > 0
    assert rtt[0]["hosts"] == bar[0]["hosts"] == 1
    assert "signal round trip" in r.stderr  # the target summary on stderr


def _descendants(root):
    """pid -> command line of every live descendant of root (from /proc)."""
    parent, cmd = {}, {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                stat = f.read()
            with open(f"/proc/{name}/cmdline", "rb") as f:
                cmd[int(name)] = f.read().split(b"\0")
        except OSError:
            continue
        parent[int(name)] = int(stat.rsplit(")", 1)[1].split()[1])
    out = {}
    for pid in parent:
        p = pid
        while p in parent and p != root and p > 1:
            p = parent[p]
        if p == root and pid != root:
            out[pid] = cmd.get(pid, [])
    return out


def test_bench_shmem_killed_rank_fails_the_run(megamoe_bin):
    env = dict(os.environ)
    proc = subprocess.Popen([MEGAMOE, "bench", "shmem"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)
    victim = None
    deadline = time.time() + 60
    while victim is None and time.time() < deadline and proc.poll() is None:
        for pid, argv in _descendants(proc.pid).items():
            if b"--worker" in argv and argv[0].endswith(b"megamoe"):  # a rank, not mpirun
                victim = pid
                break
        time.sleep(0.05)
    assert victim is not None, "no worker rank appeared"
    time.sleep(0.5)  # let it get into the measurements
    os.kill(victim, signal.SIGKILL)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode != 0
    assert "stopping the run" in err or "mpirun" in err
    assert '"rows"' not in out
