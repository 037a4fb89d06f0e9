"""Helpers of the `megamoe launch --hosts` cases (hosts_*_cases.py, run by CTest, label hosts)."""
import json
import os
import re
import subprocess
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from conftest import BUILD, MEGAMOE  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
RANK = os.path.join(HERE, "hosts_rank.py")
PY = sys.executable  # the interpreter running the tests (MEGAMOE_PYTHON in CMake)

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="simulated hosts need root (CI is root)")


def _sanitizer():
    """MEGAMOE_SANITIZE of the build under test ('' for release/debug)."""
    try:
        with open(os.path.join(BUILD, "CMakeCache.txt")) as f:
            for line in f:
                if line.startswith("MEGAMOE_SANITIZE:"):
                    return line.split("=", 1)[1].strip()
    except OSError:
        pass
    return ""


SANITIZER = _sanitizer()
# The test interpreter cannot load an ASan/TSan-instrumented libmegamoe (the sanitizer runtime must
# come first in the process); the cases that run Python ranks run against the release build
# under `make test`, and the sanitizer suites keep the C ranks.
needs_python_library = pytest.mark.skipif(
    SANITIZER != "", reason=f"Python ranks cannot load the {SANITIZER} build; make test runs this")


class Launch:
    """One finished `megamoe launch`: exit status, output, the launcher's pid."""

    def __init__(self, args, env_extra=None, env_remove=(), timeout=120):
        env = dict(os.environ)
        for k in ("HYPER_PARALLEL_SHMEM_BOOTSTRAP_ENDPOINT", "MEGAMOE_JOB_TOKEN") + tuple(env_remove):
            env.pop(k, None)
        env.update(env_extra or {})
        p = subprocess.Popen([MEGAMOE, "launch"] + list(args), stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, env=env)
        self.pid = p.pid
        try:
            self.out, self.err = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            p.kill()
            self.out, self.err = p.communicate()
            raise
        self.rc = p.returncode

    def lines(self, word):
        return [l for l in self.out.splitlines() if f"] {word} " in l]

    def json(self):
        rows = [l for l in self.out.splitlines() if l.startswith('{"launch": "summary"')]
        assert len(rows) == 1, self.out
        return json.loads(rows[0])


def links():
    return subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True).stdout


def netns_names():
    return subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout


def assert_nothing_left(launcher_pid, netns_before=None):
    """No bridge or veth of that launcher, no process named like one of its hosts."""
    text = links()
    assert f"mmlb{launcher_pid}:" not in text and f"mmlb{launcher_pid}@" not in text, text
    assert not re.search(rf"mmlv{launcher_pid}h\d+[@:]", text), text
    if netns_before is not None:
        assert netns_names() == netns_before


def probe_rows(launch):
    rows = []
    for line in launch.out.splitlines():
        m = re.match(r"\[rank (\d+) @(\S+)\] probe (\{.*\})$", line)
        if m:
            info = json.loads(m.group(3))
            info["prefix_rank"], info["prefix_host"] = int(m.group(1)), m.group(2)
            rows.append(info)
    return sorted(rows, key=lambda r: int(r["RANK"]) if r["RANK"] is not None else -1)
