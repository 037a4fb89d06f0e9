"""The operators on EP subgroups on one host (no root): 4 ranks = 2 replicas x EP 2, groups
{0,1} {2,3} and {0,2} {1,3}, each replica running its own case list (v2_subgroup_worker.py, the
worker of the simulated-hosts case in hosts_ops_v2_cases.py), every output bit for bit against
the numpy model.

That worker imports v2_cases.py on every rank, so the cases' seeds must be the same in every
process; they once came from hash(name), randomised per process, and each rank's model then
assumed inputs its peers never sent. test_case_seeds_do_not_depend_on_the_hash_seed keeps that
from coming back.
"""
import json
import os
import subprocess
import sys

from conftest import run_megamoe

HERE = os.path.dirname(os.path.abspath(__file__))


def _seeds(hash_seed):
    code = ("import json, v2_cases; print(json.dumps({w: [c['seed'] for c in cs] "
            "for w, cs in v2_cases.CASES.items()}))")
    env = dict(os.environ, PYTHONHASHSEED=str(hash_seed), PYTHONPATH=HERE)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                       timeout=60, check=True)
    return json.loads(r.stdout)


def test_case_seeds_do_not_depend_on_the_hash_seed():
    assert _seeds(1) == _seeds(2)


def test_ep_subgroups_on_one_host(tmp_path, megamoe_bin):
    prefix = str(tmp_path / "sub")
    env = {"PYTHONPATH": os.path.join(HERE, "..", "..", "python"),
           "HYPER_PARALLEL_SHMEM_HEAP_SIZE": "256M", "HYPER_PARALLEL_SHMEM_TIMEOUT_SEC": "10"}
    r = run_megamoe(["launch", "-n", "4", "--timeout", "120", "--", sys.executable,
                     os.path.join(HERE, "v2_subgroup_worker.py"), prefix], env_extra=env,
                    timeout=150)
    for rank in range(4):
        path = f"{prefix}.{rank}.json"
        assert os.path.exists(path), f"rank {rank} wrote no results:\n{r.stderr[-3000:]}"
        res = json.load(open(path))
        bad = {k: v for k, v in res.items() if v != "ok"}
        assert not bad, f"rank {rank}: {bad}"
        # block: ranks 0,1 run replica 0's 4 cases, 2,3 replica 1's 2; strided: 0,2 / 1,3
        assert len(res) == (4 if rank < 2 else 2) + (4 if rank % 2 == 0 else 2), res
    assert r.returncode == 0, r.stderr[-3000:]
