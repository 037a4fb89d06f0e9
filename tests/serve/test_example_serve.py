"""examples/python/serve_moe_model.py (a small model's MoE layers served through one mega_moe
buffer: bf16 and W8A8 layers, shared experts, prefill then decode down to 0 tokens per rank)
runs on 2 ranks exactly as its docstring says, every layer matching plain torch."""
import os
import sys

from conftest import REPO, run_megamoe


def test_serve_example(megamoe_bin):
    script = os.path.join(REPO, "examples", "python", "serve_moe_model.py")
    r = run_megamoe(["launch", "-n", "2", "--timeout", "200", "--", sys.executable, script],
                    env_extra={"MEGAMOE_THREADS": "1"}, env_remove=("PYTHONPATH",), timeout=230)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-4000:]
    for rank in range(2):
        assert f"rank {rank}: served" in out and "matched plain torch" in out, out[-4000:]
