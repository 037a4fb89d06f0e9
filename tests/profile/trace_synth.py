"""Synthetic MegaKernel traces made through the C API (megamoe.profiler.Session), shared by
the profiling tests: each worker runs, per invocation, wait -> compute -> signal per task."""
import json

from megamoe import profiler

STAGES = ["dispatch", "gmm1", "swiglu", "gmm2", "combine"]


def record_launches(session, invocations, tasks, n_cube=1, n_vector=1, step=0):
    """Per invocation: every worker does `tasks` (wait, compute, signal) back to back, inside
    the invocation's begin/end window (real clock; end() waits for the last span to finish).
    Durations depend on (worker, task) so statistics are not trivial. task = step*1000 + k."""
    for i in range(invocations):
        inv = session.begin("backward" if i % 2 else "forward")
        start = profiler.clock_ns()
        last = start
        for w in range(n_cube + n_vector):
            role, idx = (profiler.CUBE, w) if w < n_cube else (profiler.VECTOR, w - n_cube)
            t = start + w * 1300
            for k in range(tasks):
                stage = (1 + 2 * (k % 2)) if role == profiler.CUBE else (4 if k % 2 else 0)
                task = step * 1000 + k
                dw = (12000 if role == profiler.CUBE and k == 0 else 1000) + 300 * k + 10 * w
                dc = 20000 + 5000 * (k % 3) + (15000 if role == profiler.CUBE else 0)
                session.record(role, idx, profiler.WAIT, stage, t, t + dw, task=task, owner=k % 4,
                               invocation=inv)
                t += dw
                session.record(role, idx, profiler.COMPUTE, stage, t, t + dc, task=task,
                               owner=k % 4, peer=(k % 2) if role == profiler.VECTOR else -1,
                               invocation=inv)
                t += dc
                session.record(role, idx, profiler.SIGNAL, stage, t, t + 700, task=task,
                               owner=k % 4, invocation=inv)
                t += 700
            last = max(last, t)
        while profiler.clock_ns() <= last:
            pass
        session.end()


def write_rank_trace(path, rank, invocations=2, tasks=3, n_cube=1, n_vector=1, stages=STAGES):
    with profiler.Session(stages, cube_workers=n_cube, vector_workers=n_vector, rank=rank,
                          records_per_worker=4096) as s:
        s.active = True
        record_launches(s, invocations, tasks, n_cube, n_vector)
        s.export_chrome_trace(str(path))


def load(path):
    with open(path) as f:
        return json.load(f)


def records(trace):
    return [e for e in trace["traceEvents"] if e.get("cat") == "MegaKernel"]
