"""The C test harness: a skipped case is counted and printed, never OK; a requested case name
that does not exist is an error; the AMX cases skip (not pass) on a machine without AMX."""
import os
import subprocess

import pytest

from conftest import BUILD

SELFTEST = os.path.join(BUILD, "tests", "harness", "harness_selftest")
GEMM_AMX = os.path.join(BUILD, "tests", "kernels", "test_kernels_gemm_amx")


def run(prog, *names, env_extra=None):
    if not os.path.exists(prog):
        pytest.fail(f"{prog} not built; run 'make build'")
    env = {k: v for k, v in os.environ.items()
           if k not in ("RANK", "WORLD_SIZE", "MEGAMOE_TEST_SKIP_LOG")}
    env.update(env_extra or {})
    return subprocess.run([prog, *names], capture_output=True, text=True, env=env, timeout=300)


def test_skip_is_counted_printed_and_logged_never_ok(tmp_path):
    log = tmp_path / "skipped.txt"
    r = run(SELFTEST, "passes", "skips", env_extra={"MEGAMOE_TEST_SKIP_LOG": str(log)})
    assert r.returncode == 0, r.stderr
    assert "[ OK ] passes" in r.stderr
    assert "[SKIP] skips: no frobnicator here (42)" in r.stderr
    assert "[ OK ] skips" not in r.stderr
    assert "1 of 2 test cases passed, 1 skipped, 0 failed" in r.stderr
    assert log.read_text() == "harness_selftest skips: no frobnicator here (42)\n"


def test_all_skipped_exits_77_for_ctest_but_not_under_the_launcher():
    r = run(SELFTEST, "skips")
    assert r.returncode == 77, r.stderr
    assert "0 of 1 test cases passed, 1 skipped" in r.stderr
    # a rank of `megamoe launch` exits 0: the launcher takes any other status for a failure
    r = run(SELFTEST, "skips", env_extra={"RANK": "0", "WORLD_SIZE": "1"})
    assert r.returncode == 0, r.stderr
    assert "[rank 0] [SKIP] skips" in r.stderr


def test_failure_before_a_skip_stays_a_failure():
    r = run(SELFTEST, "fails_then_skips", "passes")
    assert r.returncode == 1
    assert "[FAIL] fails_then_skips" in r.stderr
    assert "[SKIP]" not in r.stderr
    r = run(SELFTEST, "fails")
    assert r.returncode == 1 and "[FAIL] fails" in r.stderr


def test_unknown_case_name_is_an_error_and_nothing_runs():
    r = run(SELFTEST, "passes", "no_such_case")
    assert r.returncode == 2
    assert 'no test case named "no_such_case"' in r.stderr
    assert "[ OK ]" not in r.stderr
    r = run(SELFTEST, "--list")
    assert r.returncode == 0
    assert r.stdout.split() == ["passes", "skips", "fails", "fails_then_skips",
                                "picks_a_free_port"]


def cpu_has_amx_bf16():
    with open("/proc/cpuinfo") as f:
        return any(line.startswith("flags") and " amx_bf16" in line for line in f)


AMX_CASES = ["bits_do_not_depend_on_blocking_splits_or_row_chunks", "gathered_rows_with_repeats",
             "micro_tile_and_k_step_edges_against_fp64", "packed_weights_give_the_bits_of_plain_b"]


def test_amx_cases_skip_without_amx_and_run_with_it():
    r = run(GEMM_AMX, "--list")
    listed = r.stdout.split()
    assert set(AMX_CASES) <= set(listed), listed
    r = run(GEMM_AMX)
    assert r.returncode in (0, 77), r.stderr
    # the UNSUPPORTED path is checked everywhere (simulated where AMX exists)
    assert "[ OK ] without_amx_every_entry_is_a_clean_unsupported" in r.stderr
    if cpu_has_amx_bf16():
        for c in AMX_CASES:
            assert f"[ OK ] {c}" in r.stderr, r.stderr
    else:
        for c in AMX_CASES:
            assert f"[SKIP] {c}: no usable AMX here" in r.stderr, r.stderr
            assert f"[ OK ] {c}" not in r.stderr
        assert f"1 of {len(listed)} test cases passed, {len(AMX_CASES)} skipped" in r.stderr


def _ephemeral_range():
    with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
        return tuple(int(v) for v in f.read().split())


def test_free_ports_lie_outside_the_ephemeral_range_and_bind():
    """Tests' bootstrap ports (C and Python helpers) are never ones a port-0 bind of the job
    (gloo, UCX) could take before rank 0 listens: the CI failure of 'Address already in use'."""
    import socket
    from free_port import free_port
    lo, hi = _ephemeral_range()
    ports = [free_port() for _ in range(20)]
    for _ in range(5):
        r = run(SELFTEST, "picks_a_free_port")
        assert r.returncode == 0, r.stderr
        ports.append(int(r.stderr.split("free port ")[1].split()[0]))
    for port in ports:
        assert not lo <= port <= hi and port >= 1024, (port, lo, hi)
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))
    assert len(set(ports)) > 15  # random picks, not one fixed port
