"""The job secret across simulated hosts under torch.distributed (CTest, label hosts; needs root).

Rank 0's bootstrap address is host 0's veth address, not loopback, so a secret is required. The
scripts remove MEGAMOE_JOB_TOKEN the launcher would give them: like a plain torchrun job, the
secret then has to come from the initialised torch.distributed group (megamoe.comm.world()
broadcasts a fresh one from rank 0).
"""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tools"))
from hosts_util import PY, Launch, assert_nothing_left, needs_root  # noqa: E402

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))

SCRIPT = r"""
import os, sys
os.environ.pop("MEGAMOE_JOB_TOKEN", None)   # as under a plain torchrun: no secret given
os.environ["HYPER_PARALLEL_SHMEM_LOG_LEVEL"] = "1"
sys.path.insert(0, os.path.join(%r, "python"))
import torch.distributed as dist
dist.init_process_group("gloo")
import megamoe.comm as comm
w = comm.world()
assert w.size == 2
comm.shutdown()
print("secret-ok", dist.get_rank(), flush=True)
dist.destroy_process_group()
""" % ROOT


def _env():
    return {"MEGAMOE_BUILD_DIR": os.environ.get("MEGAMOE_BUILD_DIR",
                                                os.path.join(ROOT, "build", "release"))}


@needs_root
def test_secret_comes_over_torch_distributed_across_hosts(tmp_path):
    script = tmp_path / "world.py"
    script.write_text(SCRIPT)
    r = Launch(["--hosts", "2", "-n", "2", "--timeout", "120", "--", PY, str(script)],
               env_extra=_env(), timeout=180)
    assert r.rc == 0, r.out + r.err
    assert r.out.count("secret-ok") == 2, r.out
    text = r.out + r.err
    assert text.count("(job secret: the job_token parameter)") == 2, text
    assert_nothing_left(r.pid)


@needs_root
def test_secret_comes_over_torchrun_across_hosts(tmp_path):
    script = tmp_path / "world.py"
    script.write_text(SCRIPT)
    # --redirects/--tee 2: torch 1.13's torchrun cannot parse the default on Python 3.11
    r = Launch(["--hosts", "2", "--per-host", "--timeout", "150", "--", PY, "-m",
                "torch.distributed.run", "--nnodes", "2", "--node_rank", "{NODE_RANK}",
                "--nproc_per_node", "1", "--master_addr", "{MASTER_ADDR}", "--master_port",
                "{MASTER_PORT}", "--redirects", "2", "--tee", "2", str(script)],
               env_extra=_env(), timeout=200)
    assert r.rc == 0, r.out + r.err
    assert r.out.count("secret-ok") == 2, r.out
    assert (r.out + r.err).count("(job secret: the job_token parameter)") == 2, r.out + r.err
    assert_nothing_left(r.pid)
