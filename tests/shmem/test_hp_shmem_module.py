"""``hyper_parallel.core.multicore.shmem`` (HyperParallel's SHMEM Python API over megamoe's
runtime) on 2 and 3 ranks: upstream's signatures, lifecycle, empty/free, put/get, signal and
wait_signal, all_gather, barriers, debug_state and the refusals (hp_shmem_worker.py)."""
import os
import sys

import pytest

from conftest import run_megamoe

HERE = os.path.dirname(os.path.abspath(__file__))


@pytest.mark.parametrize("world", [2, 3])
def test_hp_shmem_module(world, megamoe_bin):
    env = {"PYTHONPATH": os.path.join(HERE, "..", "..", "python"), "MEGAMOE_LOG_LEVEL": "off",
           "OMP_NUM_THREADS": "1"}
    r = run_megamoe(["launch", "-n", str(world), "--timeout", "100", "--", sys.executable,
                     os.path.join(HERE, "hp_shmem_worker.py")], env_extra=env, timeout=130)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-6000:]
    for rank in range(world):
        assert f"rank {rank}: ok" in out, out[-6000:]
