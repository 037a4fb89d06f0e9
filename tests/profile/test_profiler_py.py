"""megamoe.profiler: the schedule (against torch.profiler.schedule), the context manager
driving the process-wide C profiler with a synthetic producer, exports, MEGAMOE_PROFILE."""
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
    assert [r[0] for r in ready] == [4, 8]
    # cycle 0: steps 2, 3 recorded (step 1 was warm-up, discarded); cycle 1: steps 6, 7
    assert steps_in(load(ready[0][1])) == [2, 3]
    assert steps_in(load(ready[1][1])) == [6, 7]
    for _, path, summary in ready:
        t = load(path)
        assert t["megaKernelTrace"]["invocationCount"] == 2
        assert summary["invocations"] == 2 and summary["records"] == len(records(t))
        assert summary["dropped"] == 0 and 0 < summary["wait_share"] < 1


def test_default_schedule_records_the_first_step_and_dir_export(tmp_path):
    prod = Producer()
    with profiler.mega_kernel_profile(dir=tmp_path / "out") as prof:
        assert profiler.is_recording()
        for _ in range(3):
            prod.train_step()
            prof.step()
    assert steps_in(load(tmp_path / "out" / "trace_0.json")) == [0]
    # After the block the last cycle is still there to export.
    prof.export_chrome_trace(tmp_path / "after.json")
    assert steps_in(load(tmp_path / "after.json")) == [0]
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
    with pytest.raises(KeyError):
        with profiler.mega_kernel_profile():
            raise KeyError("x")
    assert not profiler.is_recording()
    with profiler.mega_kernel_profile():
        pass


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
