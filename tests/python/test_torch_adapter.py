"""The Torch adapter (libmegamoe_torch.so, torch.ops.megamoe.*): loaded next to the library the
binding uses, schemas equal to the megamoe.ops signatures, one libmegamoe per process, and on
2 ranks TorchScript calls equal to the ctypes path bit for bit (tests/python/torch_adapter_worker.py)."""
import ctypes
import json
import os
import sys

import pytest
import torch

import megamoe
import megamoe.ops as ops
from megamoe import _adapter
from conftest import BUILD, run_megamoe

HERE = os.path.dirname(os.path.abspath(__file__))
WORKER = os.path.join(HERE, "torch_adapter_worker.py")
OPS = (ops.npu_moe_distribute_dispatch_v2, ops.npu_moe_distribute_combine_v2,
       ops.npu_moe_distribute_combine_add_rms_norm)


@pytest.fixture(scope="module")
def adapter():
    built = os.path.join(BUILD, "src", "torch", "libmegamoe_torch.so")
    if not os.path.exists(built):
        pytest.fail(f"{built} not built: install libtorch-dev ('make deps') and 'make build'")
    assert _adapter.ops is not None, f"the adapter did not load: {_adapter.path}"
    return _adapter


def test_adapter_found_next_to_the_library(adapter):
    assert os.path.dirname(adapter.path) == os.path.join(os.path.dirname(megamoe.library_path),
                                                         "torch")
    assert torch.ops.megamoe.abi_version() == megamoe._lib.ABI_VERSION


@pytest.mark.parametrize("fn", OPS, ids=[f.__name__ for f in OPS])
def test_schema_equals_the_python_signature(adapter, fn):
    op = getattr(torch.ops.megamoe, fn.__name__)
    assert adapter._schema_mismatch(fn.__wrapped__, op) == ""
    assert fn.backend == "torch"
    assert fn.ctypes_path.__wrapped__ is fn.__wrapped__


def test_schema_mismatch_is_detected(adapter):
    op = torch.ops.megamoe.npu_moe_distribute_dispatch_v2
    real = ops.npu_moe_distribute_dispatch_v2.__wrapped__

    def fewer(x, expert_ids):
        pass

    def other_default(x, expert_ids, group_ep, ep_world_size, ep_rank_id, moe_expert_num, *,
                      scales=None, x_active_mask=None, expert_scales=None, elastic_info=None,
                      performance_info=None, group_tp="", tp_world_size=0, tp_rank_id=0,
                      expert_shard_type=0, shared_expert_num=2, shared_expert_rank_num=0,
                      quant_mode=0, global_bs=0, expert_token_nums_type=1, comm_alg="",
                      zero_expert_num=0, copy_expert_num=0, const_expert_num=0, y_dtype=None,
                      x_dtype=None, scales_dtype=None):
        pass

    assert adapter._schema_mismatch(real, op) == ""
    assert "2 Python parameters" in adapter._schema_mismatch(fewer, op)
    assert "'shared_expert_num'" in adapter._schema_mismatch(other_default, op)


def test_one_libmegamoe_in_the_process(adapter):
    with open("/proc/self/maps") as f:
        files = {line.split()[-1] for line in f if "libmegamoe.so" in line}
    assert len(files) == 1, files
    mine = ctypes.cast(megamoe._lib.lib.megamoe_version, ctypes.c_void_p).value
    assert torch.ops.megamoe.library_id() == mine


def test_library_errors_become_megamoe_errors(adapter):
    exc = _adapter._translate(RuntimeError("[megamoe CAPACITY_OVERFLOW -4] too many rows"))
    assert isinstance(exc, megamoe.MegaMoeError)
    assert (exc.status, exc.name, str(exc)) == (-4, "CAPACITY_OVERFLOW", "too many rows")
    other = RuntimeError("expected Tensor")
    assert _adapter._translate(other) is other


@pytest.mark.parametrize("path", ["torch", "ctypes"])
def test_local_argument_errors_match_on_both_paths(adapter, path):
    """Errors found before any collective (the wrong kind of argument, a tensor not on the CPU)
    raise the same exception types on both backends."""
    fn = ops.npu_moe_distribute_dispatch_v2
    fn = fn if path == "torch" else fn.ctypes_path
    ids = torch.zeros(2, 1, dtype=torch.int32)
    with pytest.raises(TypeError):
        fn([[1.0, 2.0]], ids, "", 2, 0, 2)
    with pytest.raises(ValueError, match="x must be a CPU tensor"):
        fn(torch.empty(2, 4, dtype=torch.bfloat16, device="meta"), ids, "", 2, 0, 2)


def check_worker_results(prefix, ranks, library_dir, adapter_path):
    for rank in range(ranks):
        path = f"{prefix}.{rank}.json"
        assert os.path.exists(path), f"rank {rank} wrote no results"
        res = json.load(open(path))
        assert res.pop("backend") == "torch"
        assert os.path.dirname(res.pop("library")) == library_dir
        assert res.pop("adapter") == adapter_path
        bad = {k: v for k, v in res.items() if v != "ok"}
        assert not bad, f"rank {rank}: " + "\n".join(f"{k}: {v}" for k, v in bad.items())
        assert set(res) == {"dispatch", "round_trip", "performance_info", "add_rms_norm",
                            "experts", "error"}


def test_torchscript_equals_ctypes_on_two_ranks(adapter, tmp_path, megamoe_bin):
    prefix = str(tmp_path / "adapter")
    env = {"PYTHONPATH": os.path.join(HERE, "..", "..", "python"), "MEGAMOE_TORCH_ADAPTER": "on",
           "HYPER_PARALLEL_SHMEM_HEAP_SIZE": "256M", "MEGAMOE_LOG_LEVEL": "off"}
    r = run_megamoe(["launch", "-n", "2", "--timeout", "120", "--", sys.executable, WORKER,
                     prefix], env_extra=env, timeout=150)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    check_worker_results(prefix, 2, os.path.dirname(megamoe.library_path), adapter.path)
