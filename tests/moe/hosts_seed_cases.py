"""The seed's two-rank sample, unchanged, across two simulated hosts under torchrun (one torchrun
per host, as a user runs it on two machines). CTest, label hosts; needs root.

Nothing in the sample knows about hosts: MegaMoeExperts finds that its peer is on another host
(its own hostname and network) and reaches it through the inter-host engine; the job secret
comes over the torch.distributed group, the endpoint is host 0's address.
"""
import os
import re
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tools"))
from hosts_util import PY, Launch, assert_nothing_left, needs_python_library, needs_root  # noqa: E402

pytestmark = needs_python_library

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
SAMPLE = os.path.join(ROOT, "examples", "python", "seed_two_rank.py")


@needs_root
def test_seed_sample_under_torchrun_on_two_hosts():
    env = {"PYTHONPATH": os.path.join(ROOT, "python"),
           "MEGAMOE_BUILD_DIR": os.environ.get("MEGAMOE_BUILD_DIR",
                                               os.path.join(ROOT, "build", "release")),
           "HYPER_PARALLEL_SHMEM_LOG_LEVEL": "1"}
    # plain torchrun carries no MEGAMOE_JOB_TOKEN: drop the launcher's from the host process
    r = Launch(["--hosts", "2", "--per-host", "--timeout", "200", "--", "env",
                "-u", "MEGAMOE_JOB_TOKEN", PY, "-m", "megamoe.torchrun", "--nnodes", "2",
                "--node_rank", "{NODE_RANK}", "--nproc_per_node", "1", "--master_addr",
                "{MASTER_ADDR}", "--master_port", "{MASTER_PORT}", "--redirects", "2", "--tee",
                "2", SAMPLE], env_extra=env, timeout=260)
    text = r.out + r.err
    assert r.rc == 0, text
    ranks = sorted(re.findall(r"rank (\d): output \(1024, 512\) torch.bfloat16", text))
    assert ranks == ["0", "1"], text
    assert "on host 1 of 2" in text and "inter-host engine up: UCX" in text, text
    assert text.count("(job secret: the job_token parameter)") == 2, text
    assert_nothing_left(r.pid)
