"""Launchers and frameworks across simulated hosts: an unchanged torch.distributed gloo script
(`megamoe launch --hosts`), torchrun per host (`--per-host`), Open MPI's mpirun (`--mpirun`), and
the --hosts plumbing of `megamoe run` / `megamoe bench layer`. Run by CTest (label hosts)."""
import json
import os
import re
import subprocess
import sys

import pytest

from hosts_util import needs_python_library, BUILD, MEGAMOE, PY, RANK, Launch, assert_nothing_left, needs_root, probe_rows

_PYTHON_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python")

GLOO = """
import os, socket, torch, torch.distributed as dist
dist.init_process_group("gloo", init_method="env://")
t = torch.tensor([float(dist.get_rank() + 1)])
dist.all_reduce(t)
print("allreduce", dist.get_rank(), dist.get_world_size(), socket.gethostname(), int(t.item()),
      flush=True)
dist.destroy_process_group()
"""


def _torch():
    return subprocess.run([PY, "-c", "import torch"], capture_output=True).returncode == 0


needs_torch = pytest.mark.skipif(not _torch(), reason=f"{sys.executable} has no torch (make deps)")


def _allreduce_lines(out):
    return sorted(re.findall(r"allreduce (\d+) (\d+) (\S+) (\d+)", out))


@needs_root
@needs_torch
def test_unchanged_gloo_script_all_reduces_across_two_hosts():
    r = Launch(["--hosts", "2", "-n", "2", "--timeout", "120", "--", PY, "-c", GLOO], timeout=180)
    assert r.rc == 0, r.err
    rows = _allreduce_lines(r.out)
    assert [(x[0], x[1], x[3]) for x in rows] == [("0", "2", "3"), ("1", "2", "3")], r.out
    assert rows[0][2] != rows[1][2]  # two hostnames
    assert_nothing_left(r.pid)


@needs_root
@needs_torch
@needs_python_library  # megamoe.torchrun imports megamoe
def test_torchrun_per_host_all_reduces_across_two_hosts(tmp_path):
    script = tmp_path / "gloo_all_reduce.py"
    script.write_text(GLOO)
    # --redirects/--tee 2: torch 1.13's torchrun cannot parse the default on Python 3.11;
    # megamoe.torchrun is torchrun that also runs on torch without libuv (Debian 13's 2.6)
    r = Launch(["--hosts", "2", "--per-host", "--timeout", "150", "--", PY, "-m",
                "megamoe.torchrun", "--nnodes", "2", "--node_rank", "{NODE_RANK}",
                "--nproc_per_node", "1", "--master_addr", "{MASTER_ADDR}", "--master_port",
                "{MASTER_PORT}", "--redirects", "2", "--tee", "2", str(script)], timeout=200,
               env_extra={"PYTHONPATH": _PYTHON_DIR + os.pathsep + os.environ.get("PYTHONPATH", "")})
    assert r.rc == 0, r.err
    rows = _allreduce_lines(r.out)
    assert [(x[0], x[1], x[3]) for x in rows] == [("0", "2", "3"), ("1", "2", "3")], r.out
    assert rows[0][2] != rows[1][2]
    assert re.search(r"^\[host 1 @mm\d+-host1\] ", r.out, re.M), r.out
    assert_nothing_left(r.pid)


@needs_root
def test_per_host_mode_starts_one_process_per_host_with_placeholders_expanded():
    r = Launch(["--hosts", "3", "--per-host", "--timeout", "60", "--", "sh", "-c",
                "echo node {NODE_RANK} of {NNODES} $NODE_RANK $NNODES {MASTER_ADDR} $MASTER_ADDR "
                "{HOSTNAME} $(hostname) {HOST_IP} ${RANK:-norank}"])
    assert r.rc == 0, r.err
    rows = sorted(l.split("] ", 1)[1].split() for l in r.out.splitlines() if "] node " in l)
    assert len(rows) == 3, r.out
    for h, x in enumerate(rows):
        assert x[1] == x[4] == str(h) and x[3] == x[5] == "3" and x[6] == x[7] == rows[0][6]
        assert x[8] == x[9] and x[8].endswith(f"-host{h}") and x[11] == "norank"
        assert x[10].endswith(f".{h + 1}")


@needs_root
@pytest.mark.skipif(not os.path.exists(os.path.join(BUILD, "tests", "tools", "hosts_mpi_probe")),
                    reason="built without MPI (MEGAMOE_WITH_MPI=OFF)")
def test_mpirun_mode_runs_an_mpi_job_across_two_hosts():
    probe = os.path.join(BUILD, "tests", "tools", "hosts_mpi_probe")
    r = Launch(["--hosts", "2", "--mpirun", "-n", "4", "--timeout", "120", "--", probe])
    assert r.rc == 0, r.err
    rows = [dict(kv.split("=", 1) for kv in l.split("mpiprobe ")[1].split())
            for l in r.out.splitlines() if "mpiprobe " in l]
    rows.sort(key=lambda x: int(x["rank"]))
    assert [x["rank"] for x in rows] == ["0", "1", "2", "3"], r.out
    hosts = [x["host"] for x in rows]
    assert hosts[0] == hosts[1] != hosts[2] == hosts[3]
    assert [x["local"] for x in rows] == ["0", "1", "0", "1"]
    for x in rows:
        assert x["size"] == "4" and x["sum"] == "10" and x["exchange"] == "ok"
        assert re.fullmatch(r"tcp://10\.\d+\.\d+\.1:8662", x["endpoint"]) and x["token_len"] == "64"
    assert_nothing_left(r.pid)


@needs_root
def test_mpirun_mode_gives_ranks_open_mpi_variables_and_the_job_secret():
    r = Launch(["--hosts", "2", "--mpirun", "-n", "2", "--timeout", "120", "--", PY, RANK,
                "probe"], {"MEGAMOE_JOB_TOKEN": "kept-token"})
    assert r.rc == 0, r.err
    rows = [json.loads(l.split("probe ", 1)[1]) for l in r.out.splitlines() if "] probe {" in l]
    rows.sort(key=lambda x: int(x["OMPI_COMM_WORLD_RANK"]))
    assert [x["OMPI_COMM_WORLD_RANK"] for x in rows] == ["0", "1"]
    assert all(x["OMPI_COMM_WORLD_SIZE"] == "2" and x["RANK"] is None for x in rows)
    assert rows[0]["hostname"] != rows[1]["hostname"]
    assert all(x["MEGAMOE_JOB_TOKEN"] == "kept-token" for x in rows)
    assert all(x["HYPER_PARALLEL_SHMEM_BOOTSTRAP_ENDPOINT"] == f"tcp://{rows[0]['ip']}:8662"
               for x in rows)


def _bench_rows(out):
    return json.loads(out)["rows"]


@needs_root
def test_bench_layer_and_run_pass_hosts_to_the_launcher():
    args = ["bench", "layer", "--shapes", "seed", "--workers", "1", "--routing", "balanced",
            "--iters", "1", "--warmup", "0", "--torch", "no", "--profile-variant", "no",
            "--training-step", "no"]
    r = subprocess.run([MEGAMOE] + args + ["--hosts", "1"], capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr
    rows = _bench_rows(r.stdout)
    assert rows and all(x["hosts"] == 1 for x in rows)
    # two hosts: the job runs there, beside the same job on one host (over_single_host)
    r = subprocess.run([MEGAMOE] + args + ["--hosts", "2"], capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr
    rows = _bench_rows(r.stdout)
    assert sorted({x["hosts"] for x in rows}) == [1, 2], rows
    two = [x for x in rows if x["hosts"] == 2]
    assert {x["schedule"] for x in two} == {"O0", "O1"}
    assert all(x["fwd_bwd_ms"] > 0 and x["over_single_host"] > 0 for x in two), two
    assert all(x["same_output_as_o0"] for x in two if x["schedule"] == "O1")
    # issue 31: bytes to the other host per step, the engine traffic behind them, the floor
    for x in two:
        assert x["bytes_to_other_hosts"] > 1e6 and 0 < x["engine_messages"] < 500, x
        assert x["engine_round_trips"] >= 0 and x["wire_floor_ms"] > 0, x
        assert x["over_wire_floor"] >= 0, x
    assert "at the wire's speed" in r.stderr
    assert "over the same job on 1 host" in r.stderr
    r = subprocess.run([MEGAMOE, "run", "--hosts", "2", "--iters", "1", "--warmup", "0",
                        "--verify", "no"], capture_output=True, text=True, timeout=300)
    assert "on 2 simulated hosts" in r.stdout, r.stdout
    assert r.returncode == 0, r.stderr
    r = subprocess.run([MEGAMOE, "run", "--hosts", "2", "-n", "3", "--experts", "6"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "multiple of --hosts 2" in r.stderr
