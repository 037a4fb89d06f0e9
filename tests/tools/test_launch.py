"""megamoe launch: environment, prefixes, failure propagation, timeouts, no leftovers."""
import os
import subprocess
import sys
import time

from conftest import run_megamoe

PY = sys.executable


def _alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:
        return f.read().split(") ")[1][0] != "Z"


def test_normal_run_returns_zero_and_sets_environment(megamoe_bin):
    code = ("import os; print('env', os.environ['RANK'], os.environ['WORLD_SIZE'], "
            "os.environ['LOCAL_RANK'], os.environ['LOCAL_WORLD_SIZE'], "
            "os.environ['HYPER_PARALLEL_SHMEM_BOOTSTRAP_ENDPOINT'], "
            "len(os.environ['MEGAMOE_JOB_TOKEN']), os.environ['MASTER_PORT'])")
    r = run_megamoe(["launch", "-n", "3", "--", PY, "-c", code])
    assert r.returncode == 0, r.stderr
    lines = sorted(l for l in r.stdout.splitlines() if " env " in l)
    assert len(lines) == 3
    endpoints = set()
    for rank, line in enumerate(lines):
        parts = line.split()
        assert parts[0:2] == ["[rank", f"{rank}]"]
        assert parts[3:7] == [str(rank), "3", str(rank), "3"]
        assert parts[7].startswith("tcp://127.0.0.1:")
        assert parts[8] == "64"
        endpoints.add(parts[7])
        # both ports outside the ephemeral range: a port-0 bind of the job (gloo, UCX) or an
        # outgoing connection cannot take them before rank 0 listens
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            lo, hi = (int(v) for v in f.read().split())
        boot, master = int(parts[7].rsplit(":", 1)[1]), int(parts[9])
        assert boot != master and not lo <= boot <= hi and not lo <= master <= hi, (boot, master)
    assert len(endpoints) == 1


def test_failing_rank_stops_the_others_quickly(megamoe_bin, tmp_path):
    pidfile = tmp_path / "pids"
    code = (
        "import os, sys, time\n"
        f"open({str(pidfile)!r}, 'a').write(str(os.getpid()) + '\\n')\n"
        "if os.environ['RANK'] == '1':\n"
        "    time.sleep(0.5); sys.exit(3)\n"
        "time.sleep(600)\n")
    t0 = time.monotonic()
    r = run_megamoe(["launch", "-n", "3", "--", PY, "-c", code], timeout=60)
    elapsed = time.monotonic() - t0
    assert r.returncode == 3
    assert elapsed < 5.5, elapsed
    assert "rank 1 exited with status 3" in r.stderr
    pids = [int(p) for p in pidfile.read_text().split()]
    assert len(pids) == 3
    time.sleep(0.2)
    assert not any(_alive(p) for p in pids)


def test_rank_ignoring_sigterm_is_killed(megamoe_bin):
    code = ("import os, signal, sys, time\n"
            "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
            "if os.environ['RANK'] == '0': sys.exit(5)\n"
            "time.sleep(600)\n")
    t0 = time.monotonic()
    r = run_megamoe(["launch", "-n", "2", "--", PY, "-c", code], timeout=60)
    assert r.returncode == 5
    assert time.monotonic() - t0 < 5.5


def test_hanging_rank_is_stopped_at_the_timeout(megamoe_bin):
    code = "import time; time.sleep(600)"
    t0 = time.monotonic()
    r = run_megamoe(["launch", "-n", "2", "--timeout", "1", "--", PY, "-c", code], timeout=60)
    assert r.returncode == 124
    assert time.monotonic() - t0 < 5
    assert "timeout after 1 s" in r.stderr


def test_killed_rank_is_reported_with_its_signal(megamoe_bin):
    code = ("import os, signal, time\n"
            "if os.environ['RANK'] == '1': os.kill(os.getpid(), signal.SIGKILL)\n"
            "time.sleep(600)\n")
    r = run_megamoe(["launch", "-n", "2", "--", PY, "-c", code], timeout=60)
    assert r.returncode == 128 + 9
    assert "rank 1 was killed by signal 9" in r.stderr


def test_output_is_prefixed_per_line(megamoe_bin):
    code = "import sys; print('a\\nb'); print('err', file=sys.stderr)"
    r = run_megamoe(["launch", "-n", "2", "--", PY, "-c", code])
    assert r.returncode == 0
    assert sorted(r.stdout.splitlines()) == ["[rank 0] a", "[rank 0] b", "[rank 1] a", "[rank 1] b"]
    assert "[rank 0] err" in r.stderr and "[rank 1] err" in r.stderr


def test_bad_usage(megamoe_bin):
    assert run_megamoe(["launch", "-n", "0", "--", "true"]).returncode == 2
    assert run_megamoe(["launch", "--", "true"]).returncode == 2
    assert run_megamoe(["launch", "-n", "2"]).returncode == 2
    r = run_megamoe(["launch", "-n", "1", "--", "/nonexistent/cmd"])
    assert r.returncode == 127
    assert "cannot run" in r.stderr


def test_timeout_must_be_a_finite_number(megamoe_bin):
    # "nan" parsed as a number that never compares greater: the job would run without limit
    for bad in ("nan", "inf", "", "-1", "5x"):
        r = run_megamoe(["launch", "-n", "1", "--timeout", bad, "--", "true"], timeout=20)
        assert r.returncode == 2, (bad, r.returncode, r.stderr)
        assert "--timeout" in r.stderr


def test_user_endpoint_and_token_are_kept(megamoe_bin):
    code = ("import os; print('env', os.environ['HYPER_PARALLEL_SHMEM_BOOTSTRAP_ENDPOINT'], "
            "os.environ['MEGAMOE_JOB_TOKEN'])")
    r = run_megamoe(["launch", "-n", "2", "--", PY, "-c", code],
                    env_extra={"HYPER_PARALLEL_SHMEM_BOOTSTRAP_ENDPOINT": "tcp://127.0.0.1:39111",
                               "MEGAMOE_JOB_TOKEN": "my-token"})
    assert r.returncode == 0, r.stderr
    lines = sorted(l for l in r.stdout.splitlines() if " env " in l)
    assert lines == ["[rank 0] env tcp://127.0.0.1:39111 my-token",
                     "[rank 1] env tcp://127.0.0.1:39111 my-token"]
    # unset (or empty): the launcher picks a free loopback port and a fresh token per job
    r = run_megamoe(["launch", "-n", "1", "--", PY, "-c", code],
                    env_extra={"HYPER_PARALLEL_SHMEM_BOOTSTRAP_ENDPOINT": "", "MEGAMOE_JOB_TOKEN": ""})
    parts = r.stdout.split()
    assert r.returncode == 0 and parts[3].startswith("tcp://127.0.0.1:") and len(parts[4]) == 64


def test_user_token_authenticates_a_real_job(megamoe_bin):
    # a job whose ranks authenticate with the token the user set (launch keeps it)
    r = run_megamoe(["run", "--iters", "1", "--warmup", "0", "--verify", "no"],
                    env_extra={"MEGAMOE_JOB_TOKEN": "0123456789abcdef0123456789abcdef"}, timeout=300)
    assert r.returncode == 0, r.stderr


def test_hosts_options_are_checked_before_anything_is_created(megamoe_bin):
    cases = [
        (["--per-host", "--", "true"], "--per-host needs --hosts"),
        (["-n", "2", "--mpirun", "--", "true"], "--mpirun needs --hosts"),
        (["-n", "2", "--fault", "kill-host:0@1", "--timeout", "5", "--", "true"],
         "--fault kill-host / cut-host needs --hosts"),
        (["--hosts", "2", "-n", "3", "--", "true"], "multiple of --hosts 2"),
        (["--hosts", "2", "-n", "2", "--fault", "kill-host:0@1", "--", "true"], "--fault needs --timeout"),
        (["--hosts", "2", "-n", "2", "--timeout", "5", "--fault", "kill-host:2@1", "--", "true"],
         "names host 2"),
        (["--hosts", "2", "-n", "2", "--timeout", "5", "--fault", "drop-host:0@1", "--", "true"],
         "expected kill-host:I@S"),
        (["--hosts", "2", "-n", "2", "--timeout", "5", "--fault", "cut-host:0@x", "--", "true"],
         "expected kill-host:I@S"),
        (["--hosts", "2", "--per-host", "-n", "2", "--", "true"], "not -n"),
        (["--hosts", "2", "--per-host", "--mpirun", "--", "true"], "exclude each other"),
        (["--hosts", "0", "-n", "2", "--", "true"], "--hosts must be an integer"),
        (["--hosts", "2", "-n", "2", "--mpi-arg", "-v", "--", "true"], "--mpi-arg needs --mpirun"),
    ]
    for args, message in cases:
        r = run_megamoe(["launch"] + args, timeout=20)
        assert r.returncode == 2, (args, r.stderr)
        assert message in r.stderr, (args, r.stderr)


def test_long_lines_stay_whole(megamoe_bin):
    # a benchmark's one-line JSON result (tens of KB) keeps one prefix and no break inside;
    # beyond the launcher's 64 KiB line buffer a line is cut into pieces
    code = ("import sys; sys.stdout.write('x' * 40000 + '\\nshort\\n' + 'y' * 70000 + '\\n')")
    r = run_megamoe(["launch", "-n", "2", "--", PY, "-c", code])
    assert r.returncode == 0, r.stderr
    for rank in (0, 1):
        lines = [l for l in r.stdout.splitlines() if l.startswith(f"[rank {rank}] ")]
        assert lines[:2] == [f"[rank {rank}] " + "x" * 40000, f"[rank {rank}] short"], \
            [l[:40] for l in lines]
        assert "".join(l[len(f"[rank {rank}] "):] for l in lines[2:]) == "y" * 70000
