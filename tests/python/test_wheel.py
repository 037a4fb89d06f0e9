"""`pip install .` into a fresh venv made with --system-site-packages (Debian's torch), without
network: the wheel carries libmegamoe.so.<ABI>, the Torch adapter and the `megamoe` CLI; from a
directory outside the source tree `import megamoe` and the HyperParallel import line work, the
CLI is on the venv's PATH, the package loads its own payload even when the source checkout's
variables point elsewhere, and the adapter worker passes on 2 ranks launched by the venv's CLI."""
import json
import os
import shutil
import subprocess
import sys

from conftest import BUILD, REPO
from megamoe import _adapter, _lib
from test_torch_adapter import WORKER, check_worker_results

ADAPTER = _adapter.adapter_name()  # the adapter built for this torch (when libtorch-dev is there)
HAS_ADAPTER = os.path.exists(os.path.join(BUILD, "src", "torch", ADAPTER))
BACKEND = "torch" if HAS_ADAPTER else "ctypes"

PROBE = """
import json, shutil, megamoe, megamoe.ops as ops
from megamoe import _adapter
from hyper_parallel.core.multicore import MegaMoeExperts
print(json.dumps({"package": megamoe.__file__, "library": megamoe.library_path,
                  "adapter": _adapter.path, "backend": ops.npu_moe_distribute_dispatch_v2.backend,
                  "same_class": MegaMoeExperts is megamoe.MegaMoeExperts,
                  "version": megamoe.__version__, "cli": shutil.which("megamoe")}))
"""


def _clean_env(venv):
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("MEGAMOE_", "PYTHON", "PIP_", "VIRTUAL_ENV"))}
    env["PATH"] = os.path.join(venv, "bin") + os.pathsep + env.get("PATH", "")
    return env


def test_pip_install_into_a_venv(tmp_path, megamoe_bin):
    venv = str(tmp_path / "venv")
    # Debian's pip from the system site-packages installs into the venv (no pip copied in)
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", "--without-pip",
                    venv], check=True)
    py = os.path.join(venv, "bin", "python")
    env = _clean_env(venv)
    build_env = dict(env, MEGAMOE_BUILD_DIR=BUILD)  # reuse the tested build: no recompilation
    r = subprocess.run([py, "-m", "pip", "install", "--no-build-isolation", "--no-index",
                        "--no-deps", "--no-cache-dir", REPO], cwd=str(tmp_path), env=build_env,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]

    site = subprocess.run([py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          env=env, capture_output=True, text=True, check=True).stdout.strip()
    native = os.path.join(site, "megamoe", "_native")
    abi = _lib.ABI_VERSION
    assert sorted(os.listdir(native)) == [f"libmegamoe.so.{abi}"] + [ADAPTER] * HAS_ADAPTER

    # from elsewhere, also when the checkout's variables point at the source build
    work = tmp_path / "elsewhere"
    work.mkdir()
    for extra in ({}, {"MEGAMOE_LIB": os.path.join(BUILD, "src", "libmegamoe.so"),
                       "MEGAMOE_BUILD_DIR": BUILD, "PYTHONPATH": str(work)}):
        r = subprocess.run([py, "-c", PROBE], cwd=str(work), env=dict(env, **extra),
                           capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stderr[-3000:]
        got = json.loads(r.stdout.strip().splitlines()[-1])
        assert got["package"] == os.path.join(site, "megamoe", "__init__.py"), got
        assert got["library"] == os.path.join(native, f"libmegamoe.so.{abi}"), got
        assert got["adapter"] == (os.path.join(native, ADAPTER) if HAS_ADAPTER else None), got
        assert got["backend"] == BACKEND and got["same_class"], got
        assert got["cli"] == os.path.join(venv, "bin", "megamoe"), got

    cli = os.path.join(venv, "bin", "megamoe")
    info = subprocess.run([cli, "info"], env=env, capture_output=True, text=True, timeout=60)
    assert info.returncode == 0 and info.stdout.startswith(f"megamoe {got['version']} "), info.stdout
    # the benchmarks' Python parts beside the CLI: `megamoe bench report` finds its script
    assert os.path.isfile(os.path.join(venv, "share", "megamoe", "bench", "report.py"))
    rep = subprocess.run([cli, "bench", "report", "--help"], cwd=str(work), env=env,
                         capture_output=True, text=True, timeout=60)
    assert rep.returncode == 0 and "--from" in rep.stdout, rep.stderr

    worker = str(work / "torch_adapter_worker.py")
    shutil.copy(WORKER, worker)
    prefix = str(work / "wheel")
    run_env = dict(env, MEGAMOE_TORCH_ADAPTER="on" if HAS_ADAPTER else "off",
                   HYPER_PARALLEL_SHMEM_HEAP_SIZE="256M", MEGAMOE_LOG_LEVEL="off")
    r = subprocess.run([cli, "launch", "-n", "2", "--timeout", "120", "--", py, worker, prefix],
                       cwd=str(work), env=run_env, capture_output=True, text=True, timeout=150)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    check_worker_results(prefix, 2, native, os.path.join(native, ADAPTER) if HAS_ADAPTER else None,
                         backend=BACKEND)


def test_local_native_payload(tmp_path, megamoe_bin):
    """`cmake --install` into a prefix is the other delivery: the Python package in a checkout
    pointed at the installed library (MEGAMOE_LIB) finds the adapter installed beside it."""
    prefix = str(tmp_path / "prefix")
    subprocess.run(["cmake", "--install", BUILD, "--prefix", prefix], check=True,
                   stdout=subprocess.DEVNULL)
    libdir = os.path.dirname(next(
        os.path.join(d, f) for d, _, files in os.walk(prefix) for f in files
        if f == f"libmegamoe.so.{_lib.ABI_VERSION}"))
    env = _clean_env(os.path.join(prefix))
    env.update(PYTHONPATH=os.path.join(REPO, "python"),
               MEGAMOE_LIB=os.path.join(libdir, f"libmegamoe.so.{_lib.ABI_VERSION}"))
    r = subprocess.run([sys.executable, "-c", PROBE], cwd=str(tmp_path), env=env,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert got["library"] == env["MEGAMOE_LIB"], got
    assert got["adapter"] == (os.path.join(libdir, ADAPTER) if HAS_ADAPTER else None), got
    assert got["backend"] == BACKEND and got["cli"] == os.path.join(prefix, "bin", "megamoe"), got
