"""torch.compile(model, fullgraph=True) of a model that is MegaMoeExperts plus a sum loss, on
two ranks: 3 AdamW steps with aot_eager and with inductor give parameters (and outputs, input
gradients) bit-identical to eager (tests/moe/experts_compile_worker.py). The layer is the
operator pair torch.ops.megamoe.experts_forward / experts_backward with register_autograd,
which needs torch >= 2.4: `make test-debian13` runs this on torch 2.6."""
import os
import sys

import pytest
import torch

from megamoe import _experts_ops, _library
from conftest import run_megamoe

HERE = os.path.dirname(os.path.abspath(__file__))
WORKER = os.path.join(HERE, "experts_compile_worker.py")


@pytest.mark.skipif(not (_experts_ops.DIFFERENTIABLE and _library.HAS_EFFECTS),
                    reason=f"torch {torch.__version__}: compiling the layer needs torch >= 2.4 "
                           "(`make test-debian13` runs it on torch 2.6)")
def test_compiled_training_is_bit_identical_to_eager(megamoe_bin):
    env = {"PYTHONPATH": os.path.join(HERE, "..", "..", "python"),
           "HYPER_PARALLEL_SHMEM_HEAP_SIZE": "256M", "MEGAMOE_LOG_LEVEL": "off"}
    r = run_megamoe(["launch", "-n", "2", "--timeout", "600", "--", sys.executable, WORKER,
                     "aot_eager", "inductor"], env_extra=env, timeout=660)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-6000:]
    for rank in range(2):
        for backend in ("aot_eager", "inductor"):
            assert f"rank {rank} backend {backend}: ok" in out, out[-6000:]
