"""The wheel's build step: the CMake build, staged with `cmake --install`, becomes the native
payload of the package (pyproject.toml has the metadata).

Which build: $MEGAMOE_BUILD_DIR if set, else build/release when it is configured (`make build`),
else a new build/wheel (Release, no tests). It is brought up to date with `cmake --build`, so a
wheel made after `make build` reuses that build. Into the wheel go
    megamoe/_native/libmegamoe.so.<ABI>   the library, under its SONAME (megamoe/_lib.py loads it)
    megamoe/_native/libmegamoe_torch-<torch>.so   the Torch adapter, when built (RUNPATH $ORIGIN)
    <venv>/bin/megamoe                    the CLI (a wheel data file for the scripts directory)
    <venv>/share/megamoe/bench/*.py       the benchmarks' Python parts (baselines, bench report),
                                          where the CLI looks beside itself (docs/bench_report.md)
"""
import glob
import os
import re
import shutil
import subprocess

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.dist import Distribution

ROOT = os.path.dirname(os.path.abspath(__file__))
WORK = os.path.join("build", "python")          # setuptools' own build files
STAGE = os.path.join(WORK, "stage")             # `cmake --install` of the chosen build


def _version_h(name):
    with open(os.path.join(ROOT, "include", "megamoe", "version.h")) as f:
        return re.search(rf"#define MEGAMOE_{name} \"?([0-9.]+)", f.read()).group(1)


VERSION = _version_h("VERSION_STRING")
ABI = _version_h("ABI_VERSION")


def _cmake_build_dir():
    chosen = os.environ.get("MEGAMOE_BUILD_DIR")
    if not chosen:
        release = os.path.join(ROOT, "build", "release")
        configured = os.path.exists(os.path.join(release, "CMakeCache.txt"))
        chosen = release if configured else os.path.join(ROOT, "build", "wheel")
    cache = os.path.join(chosen, "CMakeCache.txt")
    if not os.path.exists(cache):
        subprocess.check_call(["cmake", "-S", ROOT, "-B", chosen, "-DCMAKE_BUILD_TYPE=Release",
                               "-DMEGAMOE_BUILD_TESTS=OFF"])
    with open(cache) as f:
        sanitize = re.search(r"^MEGAMOE_SANITIZE:STRING=(.*)$", f.read(), re.M)
    if sanitize and sanitize.group(1):
        raise SystemExit(f"{chosen} is a sanitizer build (MEGAMOE_SANITIZE={sanitize.group(1)}); "
                         "a wheel needs a plain one: unset MEGAMOE_BUILD_DIR or point it at "
                         "build/release")
    return chosen


def _stage():
    build = _cmake_build_dir()
    subprocess.check_call(["cmake", "--build", build, "-j", str(os.cpu_count() or 1)])
    shutil.rmtree(STAGE, ignore_errors=True)
    subprocess.check_call(["cmake", "--install", build, "--prefix", STAGE],
                          stdout=subprocess.DEVNULL)
    found = glob.glob(os.path.join(STAGE, "lib*", "**", f"libmegamoe.so.{ABI}"), recursive=True)
    if not found:
        raise SystemExit(f"cmake --install {build} gave no libmegamoe.so.{ABI}")
    libdir = os.path.dirname(found[0])
    payload = [(os.path.realpath(found[0]), f"libmegamoe.so.{ABI}")]
    for adapter in glob.glob(os.path.join(libdir, "libmegamoe_torch-*.so")):
        payload.append((adapter, os.path.basename(adapter)))
    return payload


class BuildWithNative(build_py):
    """build_py plus the native payload next to the Python files."""

    def run(self):
        super().run()
        native = os.path.join(self.build_lib, "megamoe", "_native")
        shutil.rmtree(native, ignore_errors=True)  # no stale payload (an older SONAME)
        os.makedirs(native)
        for src, name in _stage():
            shutil.copy2(src, os.path.join(native, name))


class BinaryDistribution(Distribution):
    """The wheel holds native code: tag it for this platform and interpreter."""

    def has_ext_modules(self):
        return True


os.makedirs(os.path.join(ROOT, WORK), exist_ok=True)
setup(
    version=VERSION,
    cmdclass={"build_py": BuildWithNative},
    distclass=BinaryDistribution,
    # the CLI goes to the environment's bin/ (data files install relative to sys.prefix)
    data_files=[("bin", [os.path.join(STAGE, "bin", "megamoe")]),
                ("share/megamoe/bench", sorted(glob.glob(os.path.join("bench", "*.py"))))],
    options={"build": {"build_base": WORK}, "egg_info": {"egg_base": WORK}},
)
