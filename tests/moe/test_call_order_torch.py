"""Collective calls made out of order across ranks, and a bad tensor on one rank, from PyTorch
(docs/moe.md "Call order"; issue 20, issue 13 item 7): 2 ranks under `megamoe launch`, every
rank raises the same error at once (the SHMEM timeout is set far above the launch timeout, so
waiting for a peer would fail the test), and the next call gives the reference's results."""
import os
import sys

import pytest

from conftest import run_megamoe

HERE = os.path.dirname(os.path.abspath(__file__))
CASES = ["swapped_shared_layers", "close_against_forward", "forward_against_backward",
         "bad_tensor_on_one_rank"]


@pytest.fixture(scope="module")
def run(tmp_path_factory, megamoe_bin):
    store = tmp_path_factory.mktemp("call_order") / "gloo_store"
    env = {"PYTHONPATH": os.path.join(HERE, "..", "..", "python"),
           "HYPER_PARALLEL_SHMEM_TIMEOUT_SEC": "300", "OMP_NUM_THREADS": "1"}
    return run_megamoe(["launch", "-n", "2", "--timeout", "120", "--", sys.executable,
                        os.path.join(HERE, "call_order_worker.py"), str(store)] + CASES,
                       env_extra=env, timeout=150)


@pytest.mark.parametrize("case", CASES)
def test_case(run, case):
    out = run.stdout + run.stderr
    for rank in (0, 1):
        assert f"rank {rank} case {case}: ok" in out, out[-6000:]


def test_clean_exit(run):
    assert run.returncode == 0, (run.stdout + run.stderr)[-6000:]
