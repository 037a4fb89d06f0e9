"""examples/python/dispatch_combine.py (vllm-ascend style: dispatch quant_mode 2 -> a grouped MLP
over expert_token_nums -> combine) runs on 2 ranks, exactly as its docstring says, and matches
plain torch on every rank."""
import os
import sys

from conftest import REPO, run_megamoe


def test_dispatch_combine_example(megamoe_bin):
    script = os.path.join(REPO, "examples", "python", "dispatch_combine.py")
    env = {"HYPER_PARALLEL_SHMEM_HEAP_SIZE": "64M"}
    r = run_megamoe(["launch", "-n", "2", "--timeout", "120", "--", sys.executable, script],
                    env_extra=env, env_remove=("PYTHONPATH",), timeout=150)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-4000:]
    for rank in range(2):
        assert f"rank {rank}: ok dispatch quant_mode 2" in out, out[-4000:]
