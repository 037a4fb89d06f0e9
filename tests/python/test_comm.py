"""megamoe.comm: communicators bound to torch.distributed groups (2 EP x 2 TP on 4 ranks, a
non-member asking for a group), through `megamoe launch`."""
import os
import sys

import pytest

from conftest import REPO, run_megamoe

WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "comm_worker.py")


@pytest.mark.parametrize("case,ranks", [("grid", 4), ("non_member", 2)])
def test_comm_groups(megamoe_bin, case, ranks):
    env = {"PYTHONPATH": os.path.join(REPO, "python"), "HYPER_PARALLEL_SHMEM_TIMEOUT_SEC": "30",
           "OMP_NUM_THREADS": "1"}
    r = run_megamoe(["launch", "-n", str(ranks), "--timeout", "90", "--", sys.executable, WORKER,
                     case], env_extra=env, timeout=120)
    assert r.returncode == 0, (r.stdout + r.stderr)[-4000:]
    assert r.stdout.count(f"case {case}: ok") == ranks, r.stdout[-2000:]
