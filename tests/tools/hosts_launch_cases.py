"""`megamoe launch --hosts`: placement, namespaces, addresses, environment, TCP between hosts,
the user's endpoint and token, faults and their summary, cleanup on every way out, netns-exec,
the root requirement. Run by CTest (label hosts); ranks are hosts_rank.py (standard library)."""
import os
import re
import signal
import subprocess
import time

from hosts_util import MEGAMOE, PY, RANK, Launch, assert_nothing_left, links, needs_root, \
    netns_names, probe_rows


@needs_root
def test_ranks_are_placed_in_blocks_on_hosts_with_their_own_namespaces_and_addresses():
    before = netns_names()
    r = Launch(["--hosts", "2", "-n", "4", "--timeout", "60", "--", PY, RANK, "probe"])
    assert r.rc == 0, r.err
    rows = probe_rows(r)
    assert [int(x["RANK"]) for x in rows] == [0, 1, 2, 3]
    own_net = os.readlink("/proc/self/ns/net")
    hosts = [rows[0]["hostname"], rows[2]["hostname"]]
    assert hosts[0] != hosts[1] and re.fullmatch(r"mm\d+-host0", hosts[0])
    assert hosts[1] == hosts[0][:-1] + "1"
    for x in rows:
        rank = int(x["RANK"])
        h = rank // 2
        assert x["hostname"] == hosts[h] == x["prefix_host"] and x["prefix_rank"] == rank
        assert x["netns"] == rows[2 * h]["netns"] != own_net
        assert x["utsns"] == rows[2 * h]["utsns"]
        assert x["ip"] == rows[2 * h]["ip"]
        assert (x["WORLD_SIZE"], x["LOCAL_RANK"], x["LOCAL_WORLD_SIZE"]) == ("4", str(rank % 2), "2")
        assert (x["NODE_RANK"], x["GROUP_RANK"], x["NNODES"]) == (str(h), str(h), "2")
        assert x["MASTER_ADDR"] == rows[0]["ip"] and x["MASTER_PORT"] == "29500"
        assert x["HYPER_PARALLEL_SHMEM_BOOTSTRAP_ENDPOINT"] == f"tcp://{rows[0]['ip']}:8662"
        assert x["MEGAMOE_JOB_TOKEN"] == rows[0]["MEGAMOE_JOB_TOKEN"]
        assert re.fullmatch(r"[0-9a-f]{64}", x["MEGAMOE_JOB_TOKEN"])
        assert x["cwd"] == os.getcwd()
    assert rows[0]["netns"] != rows[2]["netns"] and rows[0]["ip"] != rows[2]["ip"]
    assert re.fullmatch(r"10\.2\d\d\.\d+\.1", rows[0]["ip"])
    assert rows[2]["ip"] == rows[0]["ip"][:-1] + "2"
    assert_nothing_left(r.pid, before)


@needs_root
def test_ranks_on_different_hosts_exchange_data_over_tcp():
    r = Launch(["--hosts", "2", "-n", "4", "--timeout", "60", "--", PY, RANK, "exchange"])
    assert r.rc == 0, r.err
    lines = r.lines("exchange")
    assert len(lines) == 4 and all("4194304 bytes ok" in l for l in lines), r.out
    for l in lines:  # the partner's address is the other host's
        m = re.search(r"\((10\.\S+)\) with rank \d+ at (10\.\S+):", l)
        assert m and m.group(1) != m.group(2), l
    assert_nothing_left(r.pid)


@needs_root
def test_hosts_resolve_each_other_and_have_a_private_dev_shm():
    code = ("import socket, os; print('names', socket.gethostbyname('mmhost0'), "
            "socket.gethostbyname('mmhost1'), socket.gethostbyname(socket.gethostname()), "
            "sorted(os.listdir('/dev/shm')))")
    r = Launch(["--hosts", "2", "-n", "2", "--timeout", "60", "--", PY, "-c", code])
    assert r.rc == 0, r.err
    lines = sorted(r.lines("names"))
    ip0, ip1 = lines[0].split()[4], lines[0].split()[5]
    assert lines[0].split()[6] == ip0 and lines[1].split()[6] == ip1 and ip0 != ip1
    assert all(l.endswith("[]") for l in lines)  # nothing of the root namespace's /dev/shm


@needs_root
def test_user_endpoint_and_token_are_kept_and_a_wrong_endpoint_host_is_refused():
    env = {"HYPER_PARALLEL_SHMEM_BOOTSTRAP_ENDPOINT": "tcp://mmhost0:9123",
           "MEGAMOE_JOB_TOKEN": "user-secret"}
    r = Launch(["--hosts", "2", "-n", "2", "--timeout", "60", "--", PY, RANK, "probe"], env)
    assert r.rc == 0, r.err
    rows = probe_rows(r)
    assert [x["HYPER_PARALLEL_SHMEM_BOOTSTRAP_ENDPOINT"] for x in rows] == ["tcp://mmhost0:9123"] * 2
    assert [x["MEGAMOE_JOB_TOKEN"] for x in rows] == ["user-secret"] * 2
    bad = Launch(["--hosts", "2", "-n", "2", "--", "true"],
                 {"HYPER_PARALLEL_SHMEM_BOOTSTRAP_ENDPOINT": "tcp://127.0.0.1:9123"})
    assert bad.rc == 2
    assert "does not name host 0" in bad.err and "tcp://mmhost0:PORT" in bad.err, bad.err
    assert_nothing_left(bad.pid)


def _summary(r):
    return [l for l in r.err.splitlines() if l.startswith("megamoe launch: summary: rank")]


@needs_root
def test_kill_host_fault_survivors_report_the_lost_peer_and_nothing_is_left(tmp_path):
    pids = tmp_path / "pids"
    r = Launch(["--hosts", "2", "-n", "4", "--timeout", "30", "--json",
                "--fault", "kill-host:1@1.5", "--", PY, RANK, "heartbeat", "--pidfile", str(pids)])
    assert r.rc == 0, r.err
    j = r.json()
    assert j["faults"][0]["injected"] and j["faults"][0]["processes_killed"] == 2
    assert j["survivors_exited"] and j["cleanup_ok"] and j["shm_leftovers"] == []
    procs = {p["rank"]: p for p in j["procs"]}
    for rank in (2, 3):
        assert procs[rank]["victim"] and procs[rank]["signal"] == 9
    for rank in (0, 1):
        p = procs[rank]
        assert not p["victim"] and not p["stopped"] and p["exit_status"] == 3, p
        assert p["last_stderr"].startswith("PEER_LOST"), p
    assert j["elapsed_s"] < 15
    lines = _summary(r)
    assert len(lines) == 4 and sum("[killed by the fault]" in l for l in lines) == 2, r.err
    assert "every survivor exited by itself" in r.err
    time.sleep(0.2)
    for pid in map(int, pids.read_text().split()):
        assert not os.path.exists(f"/proc/{pid}") or open(f"/proc/{pid}/stat").read().split(") ")[1][0] == "Z"
    assert_nothing_left(r.pid)


@needs_root
def test_cut_host_fault_every_rank_times_out_or_loses_its_peer_by_itself():
    r = Launch(["--hosts", "2", "-n", "4", "--timeout", "30", "--json",
                "--fault", "cut-host:1@1.5", "--", PY, RANK, "heartbeat"])
    assert r.rc == 0, r.err
    j = r.json()
    assert j["faults"][0]["injected"] and j["survivors_exited"] and j["cleanup_ok"]
    for p in j["procs"]:
        assert not p["victim"] and not p["stopped"] and p["exit_status"] in (3, 4), p
        assert p["last_stderr"].split(":")[0] in ("PEER_LOST", "TIMEOUT"), p
    for p in j["procs"]:  # the cut host hears nothing from rank 0 any more
        if p["host"] == 1:
            assert p["last_stderr"].startswith("TIMEOUT"), p
    assert "link mmlv" in r.err and "set down" in r.err
    assert_nothing_left(r.pid)


@needs_root
def test_fault_with_a_hanging_survivor_ends_at_the_timeout():
    r = Launch(["--hosts", "2", "-n", "2", "--timeout", "2", "--json",
                "--fault", "kill-host:1@0.3", "--", "sleep", "60"])
    assert r.rc == 124, r.err
    j = r.json()
    assert j["timed_out"] and not j["survivors_exited"]
    assert [p["stopped"] for p in j["procs"]] == [True, False]
    assert "[stopped at the timeout]" in r.err
    assert_nothing_left(r.pid)


@needs_root
def test_fault_that_comes_after_the_job_is_reported_as_not_injected():
    r = Launch(["--hosts", "2", "-n", "2", "--timeout", "10", "--fault", "cut-host:0@5", "--", "true"])
    assert r.rc == 1
    assert "cut-host:0@5 was not injected" in r.err


@needs_root
def test_sigterm_to_the_launcher_removes_hosts_and_ranks(tmp_path):
    pids = tmp_path / "pids"
    p = subprocess.Popen([MEGAMOE, "launch", "--hosts", "2", "-n", "2", "--", PY, RANK,
                          "heartbeat", "--pidfile", str(pids)],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    for _ in range(200):
        if pids.exists() and len(pids.read_text().split()) == 2:
            break
        time.sleep(0.05)
    assert f"mmlb{p.pid}:" in links()
    p.send_signal(signal.SIGTERM)
    out, err = p.communicate(timeout=30)
    assert p.returncode == 128 + signal.SIGTERM, err
    time.sleep(0.2)
    for pid in map(int, pids.read_text().split()):
        assert not os.path.exists(f"/proc/{pid}")
    assert_nothing_left(p.pid)


@needs_root
def test_links_of_a_launcher_killed_by_sigkill_are_removed_by_the_next_launch():
    p = subprocess.Popen([MEGAMOE, "launch", "--hosts", "2", "-n", "2", "--", "sleep", "60"],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for _ in range(200):
        if f"mmlv{p.pid}h1" in links():
            break
        time.sleep(0.05)
    p.kill()
    p.wait()
    # the bridge outlives a launcher killed by SIGKILL; the next launch removes it and says so
    # (a launch running in parallel may be the one that does)
    r = Launch(["--hosts", "1", "-n", "1", "--", "true"])
    assert r.rc == 0, r.err
    assert_nothing_left(p.pid)
    if f"mmlb{p.pid}" in r.err:
        assert "left by launchers that are gone" in r.err, r.err


@needs_root
def test_netns_exec_runs_a_command_inside_a_running_host():
    p = subprocess.Popen([MEGAMOE, "launch", "--hosts", "2", "-n", "2", "--timeout", "60", "--",
                          "sh", "-c", "hostname; sleep 30"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    names = sorted(p.stdout.readline().split()[-1] for _ in range(2))
    try:
        r = subprocess.run([MEGAMOE, "netns-exec", names[1], "--", "hostname"],
                           capture_output=True, text=True, timeout=30)
        assert r.returncode == 0 and r.stdout.strip() == names[1], r.stderr
        r = subprocess.run([MEGAMOE, "netns-exec", "--rsh", names[0], "echo", "$(hostname)"],
                           capture_output=True, text=True, timeout=30)
        assert r.stdout.strip() == names[0], r.stderr
    finally:
        p.terminate()
        p.communicate(timeout=30)
    r = subprocess.run([MEGAMOE, "netns-exec", "mm9999-host0", "--", "true"],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 2 and "no simulated host" in r.stderr
    assert_nothing_left(p.pid)


def test_hosts_without_root_is_refused_with_the_reason():
    cmd = [MEGAMOE, "launch", "--hosts", "2", "-n", "2", "--", "true"]
    if os.geteuid() == 0:
        cmd = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"] + cmd
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
    assert r.returncode == 2
    assert "--hosts needs root" in r.stderr and "CAP_NET_ADMIN" in r.stderr, r.stderr
