"""HyperParallel's newest MegaMoeExperts surface on 2 ranks (hp_surface_worker.py): the layer
under non-reentrant activation checkpointing, and replica_transport with every upstream mode."""
import os
import sys

from conftest import run_megamoe

HERE = os.path.dirname(os.path.abspath(__file__))


def test_checkpoint_and_replica_transport(megamoe_bin):
    env = {"PYTHONPATH": os.path.join(HERE, "..", "..", "python"), "OMP_NUM_THREADS": "1",
           "HYPER_PARALLEL_SHMEM_HEAP_SIZE": "256M", "MEGAMOE_LOG_LEVEL": "warn"}
    r = run_megamoe(["launch", "-n", "2", "--timeout", "200", "--", sys.executable,
                     os.path.join(HERE, "hp_surface_worker.py"), "checkpoint",
                     "replica_transport"], env_extra=env, timeout=230)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-6000:]
    for rank in (0, 1):
        for case in ("checkpoint", "replica_transport"):
            assert f"rank {rank} case {case}: ok" in out, out[-6000:]
