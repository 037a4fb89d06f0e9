"""MegaMoeExperts autograd edge cases on one rank: double backward (create_graph) is refused
instead of silently dropping the layer's second-order terms, a second backward through a
retained graph gives the same gradients again, forwards under torch.no_grad() keep no saved state, weights replaced
wholesale are re-packed, and NaN/Inf inputs or gradients are refused naming the element."""
import os
import subprocess
import sys

import pytest
from free_port import free_port as _free_port

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.abspath(os.path.join(HERE, "..", ".."))
PY = sys.executable  # the interpreter running the tests (MEGAMOE_PYTHON in CMake)


@pytest.mark.parametrize("case", ["double_backward", "retain_graph", "no_grad", "replaced_weights",
                                  "non_finite"])
def test_autograd_edge_cases(case):
    env = dict(os.environ)
    env["PYTHONPATH"] = os.path.join(REPO, "python") + os.pathsep + env.get("PYTHONPATH", "")
    env["HYPER_PARALLEL_SHMEM_BOOTSTRAP_ENDPOINT"] = f"tcp://127.0.0.1:{_free_port()}"
    env.update({"RANK": "0", "WORLD_SIZE": "1", "LOCAL_WORLD_SIZE": "1", "OMP_NUM_THREADS": "1"})
    r = subprocess.run([PY, os.path.join(HERE, "experts_autograd_worker.py"), case],
                       capture_output=True, text=True, env=env, timeout=120, cwd=REPO)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-4000:]
    assert f"case {case}: ok" in out, out[-4000:]
