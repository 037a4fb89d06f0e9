"""Shared pytest fixtures: where the build is, the megamoe binary, a helper to run it."""
import os
import subprocess
import sys

import pytest

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, os.path.join(REPO, "python"))
sys.path.insert(0, os.path.join(REPO, "tests", "harness"))  # free_port
BUILD = os.environ.get("MEGAMOE_BUILD_DIR", os.path.join(REPO, "build", "release"))
MEGAMOE = os.path.join(BUILD, "bin", "megamoe")


@pytest.fixture(scope="session")
def megamoe_bin():
    if not os.path.exists(MEGAMOE):
        pytest.fail(f"{MEGAMOE} not built; run 'make build'")
    return MEGAMOE


def run_megamoe(args, env_extra=None, timeout=120, env_remove=()):
    env = dict(os.environ)
    for k in env_remove:
        env.pop(k, None)
    env.update(env_extra or {})
    return subprocess.run([MEGAMOE] + list(args), capture_output=True, text=True,
                          env=env, timeout=timeout)
