"""mega_moe from Python through a lost rank (survive_worker.py, 3 launched ranks + a victim):
the call in flight fails with PEER_LOST (at most once), the next ones are correct for the masked
routing, query_mask_buffer shows the lost rank, the world communicator is broken and
Comm.survivors() gives the group to go on with."""
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))
from conftest import run_megamoe  # noqa: E402


def test_mega_moe_from_python_through_a_lost_rank(tmp_path, megamoe_bin):
    prefix = str(tmp_path / "res")
    r = run_megamoe(["launch", "-n", "3", "--timeout", "150", "--", "/usr/bin/python3",
                     os.path.join(HERE, "survive_worker.py"), prefix],
                    env_extra={"PYTHONPATH": os.path.join(HERE, "..", "..", "python"),
                               "MEGAMOE_THREADS": "1", "HYPER_PARALLEL_SHMEM_HEAP_SIZE": "128M"},
                    timeout=180)
    assert r.returncode == 0, r.stderr[-5000:]
    for pe in range(3):
        res = json.load(open(f"{prefix}.{pe}.json"))
        assert res["ok"] and len(res["failed"]) <= 1, res
        assert all(f == 4 for f in res["failed"]), res  # only the call in flight at the loss
        assert res["mask"] == [0, 0, 0, 1], res
        assert res["world_rank3_alive"] is False and res["world_barrier"] == "PEER_LOST", res
        assert res["survivors"] == [0, 1, 2], res
        if pe == 0:
            assert res["victim_signal"] == 9, res
