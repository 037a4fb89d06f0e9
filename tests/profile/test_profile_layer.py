"""End to end: megamoe.profiler around a real MegaMoeExperts (O1 executor) on 2 ranks. The
traces hold exactly the recorded steps' launches, with cube and vector tracks, valid records,
non-overlapping spans per worker; merge and summary read them."""
import collections
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(__file__))
from conftest import REPO, run_megamoe  # noqa: E402
from free_port import free_port as _free_port  # noqa: E402
from trace_synth import load, records  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))


def test_profiled_training_steps_on_two_ranks(tmp_path, megamoe_bin):
    env = dict(os.environ)
    env["PYTHONPATH"] = os.path.join(REPO, "python") + os.pathsep + env.get("PYTHONPATH", "")
    env["HYPER_PARALLEL_SHMEM_BOOTSTRAP_ENDPOINT"] = f"tcp://127.0.0.1:{_free_port()}"
    env["OMP_NUM_THREADS"] = "1"
    env.pop("MEGAMOE_PROFILE", None)
    cmd = [sys.executable, "-m", "megamoe.torchrun", "--nproc_per_node", "2",
           "--redirects", "2", "--tee", "2", "--master_addr", "127.0.0.1",
           "--master_port", str(_free_port()), os.path.join(HERE, "profile_layer_worker.py"),
           str(tmp_path)]
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=240, cwd=REPO)
    assert r.returncode == 0, r.stdout + r.stderr
    for rank in (0, 1):
        t = load(tmp_path / f"trace_{rank}.json")
        meta = t["megaKernelTrace"]
        assert meta["rank"] == rank and meta["droppedRecordCount"] == 0, meta["warnings"]
        assert [i["direction"] for i in meta["invocations"]] == [
            "forward", "backward", "forward", "backward"]
        # drained after every launch, renumbered into one window
        assert [i["invocation"] for i in meta["invocations"]] == [0, 1, 2, 3]
        assert meta["warnings"] == []
        names = {e["args"]["name"] for e in t["traceEvents"]
                 if e.get("ph") == "M" and e["name"] == "thread_name"}
        assert {"cube 0", "vector 0", "launch"} <= names
        recs = records(t)
        assert len(recs) == meta["recordCount"] > 0
        spans = collections.defaultdict(list)
        for e in recs:
            ts, dur = round(e["ts"] * 1000), round(e["dur"] * 1000)
            spans[e["tid"]].append((ts, ts + dur))
            assert 0 <= e["args"]["invocation"] < 4
            a = e["args"]  # detailed_task_names
            owner = f"expert{a['owner']}_" if a["owner"] >= 0 else ""
            assert e["name"] == f"{owner}{a['stage']}:{a['kind']}_task{a['task']}", e
        for v in spans.values():
            v.sort()
            assert all(a[1] <= b[0] for a, b in zip(v, v[1:]))
        stages = {e["args"]["stage"] for e in recs}
        assert len(stages) >= 4, stages
        after = load(tmp_path / f"after_{rank}.json")  # same cycle, exported after the block
        assert after["megaKernelTrace"]["recordCount"] == meta["recordCount"]
    merged = tmp_path / "merged.json"
    assert run_megamoe(["trace", "merge", str(tmp_path), "-o", str(merged)]).returncode == 0
    assert sorted({e["pid"] for e in records(load(merged))}) == [0, 1]
    r = run_megamoe(["trace", "summary", str(tmp_path), "--json"])
    assert r.returncode == 0, r.stderr
    s = json.loads(r.stdout)
    for rank in s["ranks"]:
        roles = {w["role"] for w in rank["workers"]}
        assert roles == {"cube", "vector"}
        for w in rank["workers"]:
            assert 0 <= w["waitShare"] <= 1
