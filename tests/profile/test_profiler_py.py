"""megamoe.profiler: the schedule (against torch.profiler.schedule), the context manager
driving the process-wide C profiler with a synthetic producer, exports, MEGAMOE_PROFILE."""
import json
import os
import subprocess
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))
from conftest import REPO  # noqa: E402
from trace_synth import STAGES, load, record_launches, records  # noqa: E402

import megamoe  # noqa: E402
from megamoe import profiler  # noqa: E402

A = profiler.ProfilerAction


@pytest.mark.filterwarnings("ignore:Profiler won't be using warmup")
@pytest.mark.parametrize("params", [
    dict(wait=0, warmup=0, active=1, repeat=1, skip_first=0),
    dict(wait=1, warmup=1, active=2, repeat=2, skip_first=0),
    dict(wait=2, warmup=0, active=3, repeat=0, skip_first=1),
    dict(wait=0, warmup=2, active=1, repeat=3, skip_first=4),
])
def test_schedule_matches_torch(params):
    torch_profiler = pytest.importorskip("torch.profiler")
    ours = profiler.schedule(**params)
    theirs = torch_profiler.schedule(**params)
    for step in range(40):
        assert ours(step).name == theirs(step).name, (params, step)


def test_schedule_explicit_sequence():
    s = profiler.schedule(wait=1, warmup=1, active=2, repeat=2, skip_first=1)
    want = [A.NONE, A.NONE, A.WARMUP, A.RECORD, A.RECORD_AND_SAVE,
            A.NONE, A.WARMUP, A.RECORD, A.RECORD_AND_SAVE, A.NONE, A.NONE]
    assert [s(i) for i in range(len(want))] == want


@pytest.mark.parametrize("bad", [dict(active=0), dict(wait=-1), dict(warmup=1.5),
                                 dict(repeat=True)])
def test_schedule_rejects_bad_values(bad):
    args = dict(wait=0, warmup=0, active=1, repeat=1)
    args.update(bad)
    with pytest.raises(ValueError):
        profiler.schedule(**args)


class Producer:
    """Stands in for the executor: records a launch per step while its session is active."""

    def __init__(self):
        self.session = profiler.Session(STAGES, rank=0)
        self.step = 0

    def train_step(self):
        if self.session.active:  # the executor's one branch per launch
            record_launches(self.session, 1, 2, step=self.step)
        self.step += 1

    def close(self):
        self.session.close()


def steps_in(trace):
    return sorted({e["args"]["task"] // 1000 for e in records(trace)})


def test_context_records_only_active_steps(tmp_path):
    prod = Producer()
    ready = []

    def on_ready(prof):
        path = tmp_path / f"cycle{prof.cycle}.json"
        prof.export_chrome_trace(path)
        ready.append((prof.step_num, path, prof.summary()))

    sched = profiler.schedule(wait=1, warmup=1, active=2, repeat=2)
    with profiler.mega_kernel_profile(schedule=sched, on_trace_ready=on_ready) as prof:
        assert not prod.session.active  # step 0 waits
        for _ in range(10):
            prod.train_step()
            prof.step()
        assert not profiler.is_recording()
    prod.close()
    # the callback runs at the window's last step (HyperParallel's step_num there)
    assert [r[0] for r in ready] == [3, 7]
    # cycle 0: steps 2, 3 recorded (step 1 was warm-up, discarded); cycle 1: steps 6, 7
    assert steps_in(load(ready[0][1])) == [2, 3]
    assert steps_in(load(ready[1][1])) == [6, 7]
    for _, path, summary in ready:
        t = load(path)
        assert t["megaKernelTrace"]["invocationCount"] == 2
        assert summary["invocations"] == 2 and summary["records"] == len(records(t))
        assert summary["dropped"] == 0 and 0 < summary["wait_share"] < 1


def test_default_schedule_keeps_every_call_of_the_block_and_dir_export(tmp_path):
    # HyperParallel: without a schedule every call in the context is retained, one window
    prod = Producer()
    ready = []
    with profiler.mega_kernel_profile(dir=tmp_path / "out", on_trace_ready=ready.append) as prof:
        assert profiler.is_recording()
        for _ in range(3):
            prod.train_step()
            prof.step()
        assert ready == []  # ready when the block ends
    assert ready == [prof]
    assert steps_in(load(tmp_path / "out" / "trace_0.json")) == [0, 1, 2]
    # After the block the last window is still there to export, and export returns it.
    trace = prof.export_chrome_trace(tmp_path / "sub" / "after.json")
    assert steps_in(load(tmp_path / "sub" / "after.json")) == [0, 1, 2]
    assert trace["megaKernelTrace"]["invocationCount"] == 3
    prod.close()


def test_later_cycles_go_to_cycle_dirs(tmp_path):
    prod = Producer()
    sched = profiler.schedule(wait=0, warmup=0, active=1, repeat=3)
    with profiler.mega_kernel_profile(schedule=sched, dir=tmp_path) as prof:
        for _ in range(3):
            prod.train_step()
            prof.step()
    prod.close()
    assert steps_in(load(tmp_path / "trace_0.json")) == [0]
    assert steps_in(load(tmp_path / "cycle_1" / "trace_0.json")) == [1]
    assert steps_in(load(tmp_path / "cycle_2" / "trace_0.json")) == [2]


def test_exit_while_recording_makes_the_trace_ready(tmp_path):
    prod = Producer()
    calls = []
    sched = profiler.schedule(wait=0, warmup=0, active=5, repeat=1)
    with profiler.mega_kernel_profile(schedule=sched, on_trace_ready=calls.append) as prof:
        prod.train_step()
        prof.step()
        prod.train_step()
    assert calls == [prof]
    prof.export_chrome_trace(tmp_path / "t.json")
    assert steps_in(load(tmp_path / "t.json")) == [0, 1]
    prod.close()


def test_only_one_context_and_step_outside(tmp_path):
    p1 = profiler.mega_kernel_profile()
    with p1:
        with pytest.raises(RuntimeError, match="only one"):
            with profiler.mega_kernel_profile():
                pass
    with pytest.raises(RuntimeError):
        p1.step()
    with profiler.mega_kernel_profile():  # usable again after exit
        pass
    with pytest.raises(TypeError):
        profiler.mega_kernel_profile(schedule=3)


def test_exception_in_the_block_still_cleans_up():
    prod = Producer()
    with pytest.raises(KeyError):
        with profiler.mega_kernel_profile() as prof:
            prod.train_step()
            raise KeyError("x")
    assert not profiler.is_recording()
    with pytest.raises(RuntimeError, match="no completed MegaKernel capture window"):
        prof.export_chrome_trace("never.json")  # a failed block leaves no half trace
    with profiler.mega_kernel_profile():
        pass
    prod.close()


def test_original_keyword_arguments_are_validated():
    with pytest.raises(TypeError):
        profiler.mega_kernel_profile(profiler.schedule(wait=0, warmup=0, active=1))  # keywords
    with pytest.raises(TypeError, match="detailed_task_names"):
        profiler.mega_kernel_profile(detailed_task_names=1)
    for bad in (0, -1, True, 1.5, "4"):
        with pytest.raises(ValueError, match="max_pending_calls"):
            profiler.mega_kernel_profile(max_pending_calls=bad)
    with pytest.raises(TypeError, match="ProfilerAction"):
        profiler.mega_kernel_profile(schedule=lambda step: "RECORD")
    with pytest.raises(RuntimeError, match="no completed"):
        profiler.mega_kernel_profile().export_chrome_trace("x.json")


def test_detailed_task_names_keep_the_raw_fields(tmp_path):
    traces = {}
    for detailed in (False, True):
        prod = Producer()
        with profiler.mega_kernel_profile(detailed_task_names=detailed) as prof:
            prod.train_step()
        traces[detailed] = prof.export_chrome_trace(tmp_path / f"{detailed}.json")
        prod.close()
    plain, detailed = records(traces[False]), records(traces[True])
    assert [e["args"] for e in plain] == [e["args"] for e in detailed]
    for p_, d in zip(plain, detailed):
        a = d["args"]
        assert p_["name"] == f"{a['stage']}:{a['kind']}"
        assert d["name"] == f"expert{a['owner']}_{a['stage']}:{a['kind']}_task{a['task']}"
    assert traces[True]["megaKernelTrace"]["detailedTaskNames"] is True


def test_max_pending_calls_drains_so_long_windows_lose_nothing(tmp_path, megamoe_bin):
    # rings of 16 records per worker; each launch records 6 per worker: a 6-launch window
    # overflows them unless the context drains every max_pending_calls launches
    got = {}
    for pending in (16, 2):
        s = profiler.Session(STAGES, rank=0, records_per_worker=16)
        with profiler.mega_kernel_profile(max_pending_calls=pending) as prof:
            for step in range(3):
                record_launches(s, 2, 2, step=step)
                prof.step()
        path = tmp_path / f"pending{pending}.json"
        got[pending] = prof.export_chrome_trace(path)
        s.close()
        assert prof.drains == (0 if pending == 16 else 3), prof.drains  # after launch 2, 4, 6
    assert got[16]["megaKernelTrace"]["droppedRecordCount"] > 0
    t = got[2]
    m = t["megaKernelTrace"]
    assert m["droppedRecordCount"] == 0 and m["invocationCount"] == 6
    assert m["recordCount"] == len(records(t)) == 6 * 2 * 6
    assert sorted(i["invocation"] for i in m["invocations"]) == list(range(6))
    launches = sorted(e["name"] for e in t["traceEvents"] if e.get("cat") == "MegaKernelLaunch")
    assert launches == sorted(f"{'backward' if i % 2 else 'forward'} #{i}" for i in range(6))
    assert sorted({e["args"]["invocation"] for e in records(t)}) == list(range(6))
    assert steps_in(t) == [0, 1, 2]
    summary = prof.summary()
    assert summary["invocations"] == 6 and summary["records"] == 72 and summary["dropped"] == 0
    # the merged window is a valid trace for the tools
    r = subprocess.run([megamoe_bin, "trace", "summary", str(tmp_path / "pending2.json"),
                        "--json"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    rank0 = json.loads(r.stdout)["ranks"][0]
    assert (rank0["invocations"], rank0["records"], rank0["dropped"]) == (6, 72, 0)


def test_session_errors_are_exceptions():
    with profiler.Session(STAGES, rank=0) as s:
        with pytest.raises(megamoe.MegaMoeError) as info:
            s.record(profiler.CUBE, 5, profiler.WAIT, 0, 1, 2)
        assert "no cube worker 5" in str(info.value)
    with pytest.raises(Exception, match="stage names"):
        profiler.Session([], rank=0)


def test_megamoe_profile_env_starts_recording(tmp_path):
    code = ("from megamoe import profiler; import sys;"
            "s = profiler.Session(['a'], rank=3);"
            "print(int(profiler.is_recording()), int(s.active))")
    env = dict(os.environ, PYTHONPATH=os.path.join(REPO, "python"))
    outs = []
    for value in (str(tmp_path), None):
        if value is None:
            env.pop("MEGAMOE_PROFILE", None)
        else:
            env["MEGAMOE_PROFILE"] = value
        r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                           text=True, timeout=120)
        assert r.returncode == 0, r.stderr
        outs.append(r.stdout.split())
    assert outs == [["1", "1"], ["0", "0"]]


def test_reachable_as_megamoe_profiler():
    assert megamoe.profiler.mega_kernel_profile is profiler.mega_kernel_profile
    s = megamoe.profiler.schedule(wait=0, warmup=0, active=1, repeat=1, skip_first=0)
    assert s(0) == A.RECORD_AND_SAVE and s(1) == A.NONE
