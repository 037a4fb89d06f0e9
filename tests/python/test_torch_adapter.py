"""torch.ops.megamoe and the optional Torch adapter: the Python registration defines every
operator (megamoe/_library.py); the adapter (libmegamoe_torch-<torch>.so) only adds C++ CPU
kernels, is loaded only when it was built for the running torch and links this process's
libtorch, resolves the same libmegamoe, and on 2 ranks TorchScript calls through it equal the
Python bodies bit for bit (tests/python/torch_adapter_worker.py)."""
import ctypes
import json
import os
import shutil
import sys

import pytest
import torch

import megamoe
import megamoe.ops as ops
from megamoe import _adapter, _library
from conftest import BUILD, run_megamoe

HERE = os.path.dirname(os.path.abspath(__file__))
WORKER = os.path.join(HERE, "torch_adapter_worker.py")
V2 = (ops.npu_moe_distribute_dispatch_v2, ops.npu_moe_distribute_combine_v2,
      ops.npu_moe_distribute_combine_add_rms_norm)


@pytest.fixture(scope="module")
def adapter():
    built = os.path.join(BUILD, "src", "torch", _adapter.adapter_name())
    if not os.path.exists(built):
        pytest.fail(f"{built} not built: install libtorch-dev ('make deps') and 'make build'")
    assert _adapter.loaded is not None, f"the adapter did not load: {_adapter._problems}"
    return _adapter


def test_adapter_found_next_to_the_library(adapter):
    assert adapter.path == os.path.join(os.path.dirname(megamoe.library_path), "torch",
                                        adapter.adapter_name())
    major, minor = torch.__version__.split(".")[:2]
    assert os.path.basename(adapter.path) == f"libmegamoe_torch-{major}.{minor}.so"


def test_adapter_only_adds_cpu_kernels(adapter):
    """One owner of the namespace: the schema comes from Python; the adapter's kernel is the
    CPU one of the functional twins (and of the op without an in-place argument)."""
    for fn in V2:
        assert fn.backend == "torch"
        kernel = _library.megamoe.kernel_name(fn.__name__)
        dump = torch._C._dispatch_dump(f"megamoe::{kernel}")
        cpu = [line for line in dump.splitlines() if line.startswith("CPU:")]
        assert cpu and "megamoe_torch.cpp" in cpu[0], dump
        assert "CompositeExplicitAutograd" in dump  # the Python body for everything else
    for fn in (ops.npu_moe_distribute_dispatch, ops.npu_moe_distribute_combine):
        assert fn.backend == "ctypes"  # Python mappings onto the V2 bodies


def test_needs_this_process_libtorch(adapter):
    needed = _adapter.needed_libraries(adapter.path)
    torch_libs = [n for n in needed if n.startswith(("libtorch", "libc10"))]
    assert torch_libs and all(_adapter._already_loaded(n) for n in torch_libs), needed
    assert not _adapter._already_loaded("libtorch_cpu.so.0.1")  # what a foreign one would need


def test_an_adapter_for_another_torch_is_not_looked_at(tmp_path, monkeypatch):
    """Only the file named after the running torch is a candidate: an adapter built for
    another torch beside it is never loaded (it could bring a second libtorch)."""
    lib_dir = tmp_path / "lib"
    (lib_dir / "torch").mkdir(parents=True)
    shutil.copy(megamoe.library_path, lib_dir / "libmegamoe.so")
    (lib_dir / "torch" / "libmegamoe_torch-0.1.so").write_bytes(b"not an ELF file")
    monkeypatch.setattr(_adapter._lib, "path", str(lib_dir / "libmegamoe.so"))
    assert all(os.path.basename(c) == _adapter.adapter_name() for c in _adapter._candidates())


def test_a_broken_adapter_cannot_break_import(tmp_path):
    """An unusable adapter for this torch (here: not even an ELF file) is reported, and the
    operators keep their Python bodies: `import megamoe` works."""
    lib_dir = tmp_path / "lib"
    (lib_dir / "torch").mkdir(parents=True)
    os.symlink(os.path.realpath(megamoe.library_path), lib_dir / "libmegamoe.so")
    (lib_dir / "torch" / _adapter.adapter_name()).write_bytes(b"\x7fELF garbage")
    code = ("import warnings, megamoe, megamoe.ops as ops\n"
            "print(ops.npu_moe_distribute_dispatch_v2.backend)\n")
    env = dict(os.environ, MEGAMOE_LIB=str(lib_dir / "libmegamoe.so"),
               PYTHONPATH=os.path.join(HERE, "..", "..", "python"))
    import subprocess
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.strip() == "ctypes"
    assert "cannot be used" in r.stderr
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                       env=dict(env, MEGAMOE_TORCH_ADAPTER="on"))
    assert r.returncode != 0 and "cannot be used" in r.stderr


def test_one_libmegamoe_in_the_process(adapter):
    with open("/proc/self/maps") as f:
        files = {line.split()[-1] for line in f if "libmegamoe.so" in line}
    assert len(files) == 1, files
    mine = ctypes.cast(megamoe._lib.lib.megamoe_version, ctypes.c_void_p).value
    assert adapter.loaded.megamoe_torch_adapter_library_id() == mine


def test_library_errors_become_megamoe_errors():
    exc = _library._translate(RuntimeError("[megamoe CAPACITY_OVERFLOW -4] too many rows"))
    assert isinstance(exc, megamoe.MegaMoeError)
    assert (exc.status, exc.name, str(exc)) == (-4, "CAPACITY_OVERFLOW", "too many rows")
    other = RuntimeError("expected Tensor")
    assert _library._translate(other) is other


@pytest.mark.parametrize("path", ["torch", "ctypes"])
def test_local_argument_errors_match_on_both_paths(path):
    """Errors found before any collective (the wrong kind of argument, a tensor not on the CPU)
    raise the same exception types on both paths."""
    fn = ops.npu_moe_distribute_dispatch_v2
    fn = fn if path == "torch" else fn.ctypes_path
    ids = torch.zeros(2, 1, dtype=torch.int32)
    with pytest.raises(TypeError):
        fn([[1.0, 2.0]], ids, "", 2, 0, 2)
    with pytest.raises(ValueError, match="x must be a CPU tensor"):
        fn(torch.empty(2, 4, dtype=torch.bfloat16, device="meta"), ids, "", 2, 0, 2)


def check_worker_results(prefix, ranks, library_dir, adapter_path, backend="torch"):
    for rank in range(ranks):
        path = f"{prefix}.{rank}.json"
        assert os.path.exists(path), f"rank {rank} wrote no results"
        res = json.load(open(path))
        assert res.pop("backend") == backend
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


def test_torchscript_on_the_python_bodies_on_two_ranks(tmp_path, megamoe_bin):
    """The same checks with the adapter off: torch.ops.megamoe then runs the Python bodies."""
    prefix = str(tmp_path / "bodies")
    env = {"PYTHONPATH": os.path.join(HERE, "..", "..", "python"),
           "MEGAMOE_TORCH_ADAPTER": "off", "HYPER_PARALLEL_SHMEM_HEAP_SIZE": "256M",
           "MEGAMOE_LOG_LEVEL": "off"}
    r = run_megamoe(["launch", "-n", "2", "--timeout", "120", "--", sys.executable, WORKER,
                     prefix], env_extra=env, timeout=150)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    check_worker_results(prefix, 2, os.path.dirname(megamoe.library_path), None,
                         backend="ctypes")
