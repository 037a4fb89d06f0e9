"""Hot-expert replicas from PyTorch (replica_slots_per_rank) under torchrun with a gloo group:
AdamW training of a router-skewed MoE block with replicas tracks the same run without them,
the plan is reported by info() and identical on every rank, balanced routing moves nothing,
and bad settings are refused."""
import os
import subprocess
import sys

from free_port import free_port as _free_port

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.abspath(os.path.join(HERE, "..", ".."))
PY = sys.executable  # the interpreter running the tests (MEGAMOE_PYTHON in CMake)


def test_training_with_replicas_tracks_without():
    env = dict(os.environ)
    env["PYTHONPATH"] = os.path.join(REPO, "python") + os.pathsep + env.get("PYTHONPATH", "")
    env["HYPER_PARALLEL_SHMEM_BOOTSTRAP_ENDPOINT"] = f"tcp://127.0.0.1:{_free_port()}"
    env.setdefault("OMP_NUM_THREADS", "1")
    # --redirects/--tee 2: see test_experts_torch.py (torch 1.13 on Python 3.11)
    cmd = [PY, "-m", "megamoe.torchrun", "--nproc_per_node", "2", "--redirects", "2",
           "--tee", "2", "--master_addr", "127.0.0.1", "--master_port", str(_free_port()),
           os.path.join(HERE, "replicas_train_worker.py")]
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=240, cwd=REPO)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-6000:]
    for rank in (0, 1):
        for case in ("settings", "training", "balanced"):
            assert f"rank {rank} case {case}: ok" in out, out[-6000:]
