"""``hyper_parallel.core.multicore.shmem`` across 2 simulated hosts (CTest, label hosts; needs
root): the same checks as test_hp_shmem_module.py with every peer on another host, so puts,
gets, int32 signals (64-bit engine atomics on their word) and all_gather go through the
inter-host engine."""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tools"))
from hosts_util import PY, Launch, assert_nothing_left, needs_python_library, needs_root  # noqa: E402

pytestmark = needs_python_library

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))


@needs_root
def test_hp_shmem_module_across_hosts():
    env = {"PYTHONPATH": os.path.join(ROOT, "python"), "MEGAMOE_LOG_LEVEL": "off",
           "MEGAMOE_BUILD_DIR": os.environ.get("MEGAMOE_BUILD_DIR",
                                               os.path.join(ROOT, "build", "release"))}
    r = Launch(["--hosts", "2", "-n", "2", "--timeout", "120", "--", PY,
                os.path.join(HERE, "hp_shmem_worker.py")], env_extra=env, timeout=180)
    assert r.rc == 0, r.out + r.err
    for rank in (0, 1):
        assert f"rank {rank}: ok" in r.out, r.out + r.err
    assert_nothing_left(r.pid)
