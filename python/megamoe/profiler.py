"""MegaKernel profiling from Python: which worker did what, when (docs/profiling.md).

The context manager records every MegaKernel launch (forward and backward of MegaMoeExperts
with schedule "O1") of this process while the schedule says so, and writes Chrome traces
that Perfetto (https://ui.perfetto.dev) and chrome://tracing open::

    import megamoe.profiler as profiler

    with profiler.mega_kernel_profile(
            schedule=profiler.schedule(wait=1, warmup=1, active=2, repeat=1),
            dir="traces") as prof:                 # or on_trace_ready=callable(prof)
        for batch in data:
            loss = model(batch).sum(); loss.backward(); opt.step()
            prof.step()                            # one training step done
    prof.export_chrome_trace("rank_trace.json")    # the last completed window (also returned)

Then ``megamoe trace merge traces -o merged.json`` puts every rank on one time axis and
``megamoe trace summary traces --svg timeline.svg`` prints per-stage statistics and draws the
timeline.

The schedule has torch.profiler's semantics: ``skip_first`` steps are ignored, then each cycle
is ``wait`` idle steps, ``warmup`` steps recorded and discarded, and ``active`` recorded steps;
after the last active step of a cycle the trace is ready (``on_trace_ready(prof)`` is called
and, with ``dir``, ``<dir>/trace_<rank>.json`` is written — later cycles go to
``<dir>/cycle_<k>/``). ``repeat=0`` repeats cycles until the context ends; without a schedule
the whole block is one window. The keyword arguments are HyperParallel's (``schedule``,
``on_trace_ready``, ``detailed_task_names``, ``max_pending_calls``) plus ``dir``. Only one
context may be active per process (as in the original). Recording costs a few nanoseconds per
task; with no context (and no MEGAMOE_PROFILE) the executor pays one branch per task.

:class:`Session` records spans of your own on the same clock (CLOCK_MONOTONIC, as
``time.monotonic_ns()``) into the same traces.
"""
import ctypes
import enum
import json
import os
import tempfile

from . import _lib
from .errors import check

__all__ = ["ProfilerAction", "schedule", "trace_handler", "mega_kernel_profile", "Session",
           "merge_traces", "render_svg", "WAIT", "COMPUTE", "SIGNAL", "CUBE", "VECTOR"]

_L = _lib.lib
_vp = ctypes.c_void_p
_P = ctypes.POINTER
_u64 = ctypes.c_uint64

# megamoe_profile_kind_t / megamoe_profile_role_t
WAIT, COMPUTE, SIGNAL = 0, 1, 2
CUBE, VECTOR = 0, 1


@_lib.mirror("megamoe_profile_summary_t")
class _Summary(ctypes.Structure):
    _fields_ = [("wait_ns", _u64), ("compute_ns", _u64), ("signal_ns", _u64),
                ("wall_ns", _u64), ("launch_ns", _u64), ("records", _u64), ("dropped", _u64),
                ("invocations", _u64), ("workers", ctypes.c_int), ("sessions", ctypes.c_int)]


@_lib.mirror("megamoe_profile_params_t")
class _Params(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_size_t), ("rank", ctypes.c_int), ("cube_workers", ctypes.c_int),
                ("vector_workers", ctypes.c_int), ("records_per_worker", ctypes.c_uint32),
                ("stage_names", _P(ctypes.c_char_p)), ("stage_count", ctypes.c_int)]


@_lib.mirror("megamoe_profile_record_t")
class _Record(ctypes.Structure):
    _fields_ = [("start_ns", _u64), ("end_ns", _u64), ("kind", ctypes.c_int),
                ("stage", ctypes.c_int), ("task", ctypes.c_int32), ("owner", ctypes.c_int32),
                ("peer", ctypes.c_int), ("invocation", ctypes.c_uint32)]


@_lib.mirror("megamoe_trace_svg_options_t")
class _SvgOptions(ctypes.Structure):
    _fields_ = [("width", ctypes.c_int), ("invocation", ctypes.c_int64)]


def _declare(name, restype, argtypes):
    f = getattr(_L, name)
    f.restype = restype
    f.argtypes = argtypes


_int = ctypes.c_int
_declare("megamoe_profiler_start", _int, [])
_declare("megamoe_profiler_stop", _int, [])
_declare("megamoe_profiler_is_started", _int, [])
_declare("megamoe_profiler_reset", None, [])
_declare("megamoe_profiler_session_count", _int, [])
_declare("megamoe_profiler_get_summary", _int, [_P(_Summary)])
_declare("megamoe_profiler_export", _int, [ctypes.c_char_p])
_declare("megamoe_profiler_export_dir", _int, [ctypes.c_char_p])
_declare("megamoe_profile_create", _int, [_P(_Params), _P(_vp)])
_declare("megamoe_profile_destroy", None, [_vp])
_declare("megamoe_profile_is_active", _int, [_vp])
_declare("megamoe_profile_set_active", None, [_vp, _int])
_declare("megamoe_profile_begin", _int, [_vp, ctypes.c_char_p, _P(ctypes.c_uint32)])
_declare("megamoe_profile_end", _int, [_vp])
_declare("megamoe_profile_record", _int, [_vp, _int, _int, _P(_Record)])
_declare("megamoe_profile_clock_ns", _u64, [])
_declare("megamoe_profile_get_summary", _int, [_vp, _P(_Summary)])
_declare("megamoe_profile_reset", None, [_vp])
_declare("megamoe_profile_export", _int, [_vp, ctypes.c_char_p])
_declare("megamoe_trace_merge", _int, [_P(ctypes.c_char_p), ctypes.c_size_t, ctypes.c_char_p])
_declare("megamoe_trace_svg", _int, [_P(ctypes.c_char_p), ctypes.c_size_t, _P(_SvgOptions),
                                      ctypes.c_char_p])


def _summary_dict(s):
    d = {name: getattr(s, name) for name, _ in _Summary._fields_}
    d["wait_share"] = (s.wait_ns / (s.launch_ns * s.workers)) if s.launch_ns and s.workers else 0.0
    return d


def _paths(inputs):
    if isinstance(inputs, (str, os.PathLike)):
        inputs = [inputs]
    encoded = [os.fsencode(p) for p in inputs]
    return (ctypes.c_char_p * max(1, len(encoded)))(*encoded), len(encoded)


# ---- schedule ------------------------------------------------------------------------------

class ProfilerAction(enum.Enum):
    NONE = 0
    WARMUP = 1
    RECORD = 2
    RECORD_AND_SAVE = 3


def schedule(*, wait, warmup, active, repeat=0, skip_first=0):
    """The action of each step (0, 1, ...): torch.profiler.schedule semantics.

    ``active`` >= 1; the others >= 0; ``repeat=0`` repeats the cycle forever.
    """
    for name, value, low in (("wait", wait, 0), ("warmup", warmup, 0), ("active", active, 1),
                             ("repeat", repeat, 0), ("skip_first", skip_first, 0)):
        if not isinstance(value, int) or isinstance(value, bool) or value < low:
            raise ValueError(f"profiler.schedule: {name}={value!r} must be an integer >= {low}")
    cycle = wait + warmup + active

    def action(step):
        if step < 0:
            raise ValueError(f"profiler schedule: step {step} is negative")
        if step < skip_first:
            return ProfilerAction.NONE
        step -= skip_first
        if repeat > 0 and step // cycle >= repeat:
            return ProfilerAction.NONE
        pos = step % cycle
        if pos < wait:
            return ProfilerAction.NONE
        if pos < wait + warmup:
            return ProfilerAction.WARMUP
        return ProfilerAction.RECORD if pos < cycle - 1 else ProfilerAction.RECORD_AND_SAVE

    action.wait, action.warmup, action.active = wait, warmup, active
    action.repeat, action.skip_first = repeat, skip_first
    return action


def trace_handler(dir_name):
    """on_trace_ready that writes ``<dir>/trace_<rank>.json`` (cycle k >= 1: ``<dir>/cycle_<k>/``)."""
    def handler(prof):
        d = dir_name if prof.cycle == 0 else os.path.join(dir_name, f"cycle_{prof.cycle}")
        prof.export_chrome_trace_dir(d)
    return handler


# ---- the context manager -------------------------------------------------------------------

_active_profile = None
_RECORDING = (ProfilerAction.RECORD, ProfilerAction.RECORD_AND_SAVE)


def _load_json(path):
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def _merge_segments(segments):
    """One window's trace from the traces drained during it (each numbers its invocations from
    0, per rank and resource group): metadata once, later segments' invocations renumbered after
    the earlier ones', counts summed."""
    if len(segments) == 1:
        return segments[0]
    meta_seen, meta, spans, invocations, warnings = set(), [], [], [], []
    offset = {}  # (rank, group) -> invocations of that session in the earlier segments
    totals = {"invocationCount": 0, "recordCount": 0, "droppedRecordCount": 0}
    ranks = {}
    for seg in segments:
        m = seg["megaKernelTrace"]
        group_of = {(e["pid"], e["tid"]): e["args"].get("group", 0) for e in seg["traceEvents"]
                    if e.get("ph") == "M" and e.get("name") == "thread_name"}
        for e in seg["traceEvents"]:
            if e.get("ph") == "M":
                key = json.dumps(e, sort_keys=True)
                if key not in meta_seen:
                    meta_seen.add(key)
                    meta.append(e)
                continue
            off = offset.get((e.get("pid"), group_of.get((e.get("pid"), e.get("tid")), 0)), 0)
            args = e.get("args", {})
            if off and "invocation" in args:
                e = dict(e, args=dict(args, invocation=args["invocation"] + off))
                if e.get("cat") == "MegaKernelLaunch":
                    e["name"] = f"{args.get('direction', 'launch')} #{e['args']['invocation']}"
            spans.append(e)
        seen = {}
        for inv in m.get("invocations", []):
            key = (inv["rank"], inv.get("group", 0))
            invocations.append(dict(inv, invocation=inv["invocation"] + offset.get(key, 0)))
            seen[key] = max(seen.get(key, 0), inv["invocation"] + 1)
        for key, n in seen.items():
            offset[key] = offset.get(key, 0) + n
        for k in totals:
            totals[k] += m.get(k, 0)
        for r in m.get("ranks", []):
            acc = ranks.setdefault(r["rank"], dict(r, invocationCount=0, recordCount=0,
                                                   droppedRecordCount=0))
            for k in totals:
                acc[k] += r.get(k, 0)
        warnings += [w for w in m.get("warnings", []) if w not in warnings]
    first = segments[0]["megaKernelTrace"]
    out = dict(segments[0], traceEvents=meta + spans)
    out["megaKernelTrace"] = dict(first, **totals, warnings=warnings,
                                  ranks=[ranks[r] for r in sorted(ranks)],
                                  invocations=invocations)
    return out


def _detailed_names(trace):
    """detailed_task_names: "expert3_gmm1:compute_task72" instead of "gmm1:compute" (the raw
    stage, kind, owner and task stay in args)."""
    for e in trace["traceEvents"]:
        if e.get("cat") == "MegaKernel":
            a = e["args"]
            owner = f"expert{a['owner']}_" if a.get("owner", -1) >= 0 else ""
            e["name"] = f"{owner}{a['stage']}:{a['kind']}_task{a['task']}"
    return trace


def _trace_summary(trace):
    """The totals of megamoe_profile_summary_t, computed from a window's trace."""
    ev = trace["traceEvents"]
    recs = [e for e in ev if e.get("cat") == "MegaKernel"]
    ns = lambda us: int(round(us * 1000))  # noqa: E731  (exact: 3 decimals of microseconds)
    kinds = {"wait": 0, "compute": 0, "signal": 0}
    for e in recs:
        kinds[e["args"]["kind"]] = kinds.get(e["args"]["kind"], 0) + ns(e["dur"])
    tracks = [e for e in ev if e.get("ph") == "M" and e.get("name") == "thread_name"]
    m = trace["megaKernelTrace"]
    s = {"wait_ns": kinds["wait"], "compute_ns": kinds["compute"], "signal_ns": kinds["signal"],
         "wall_ns": (ns(max(e["ts"] + e["dur"] for e in recs)) - ns(min(e["ts"] for e in recs))
                     if recs else 0),
         "launch_ns": sum(ns(e["dur"]) for e in ev if e.get("cat") == "MegaKernelLaunch"),
         "records": len(recs), "dropped": m.get("droppedRecordCount", 0),
         "invocations": m.get("invocationCount", 0),
         "workers": sum(1 for e in tracks if e["args"].get("role") in ("cube", "vector")),
         "sessions": len({(e["pid"], e["args"].get("group", 0)) for e in tracks})}
    s["wait_share"] = (s["wait_ns"] / (s["launch_ns"] * s["workers"])
                       if s["launch_ns"] and s["workers"] else 0.0)
    return s


def _note_invocation():
    """Producers call this after each launch (MegaMoeExperts forward/backward, Session.end):
    the active context drains every max_pending_calls launches."""
    prof = _active_profile
    if prof is not None:
        prof._after_invocation()


class mega_kernel_profile:
    """Record MegaKernel launches of this process by schedule; see the module docstring.

    Keyword arguments as HyperParallel's ``mega_kernel_profile``: ``schedule`` (None: every
    launch in the block is one window, ready when the block ends), ``on_trace_ready``
    (``callback(prof)`` after each window), ``detailed_task_names`` (event names with the
    owner expert and task index), ``max_pending_calls`` (launches recorded before the rings are
    drained into the window, so long windows lose nothing); plus ``dir`` (write
    ``<dir>/trace_<rank>.json`` per window).
    """

    def __init__(self, *, schedule=None, on_trace_ready=None, detailed_task_names=False,
                 max_pending_calls=16, dir=None):
        if schedule is not None and not callable(schedule):
            raise TypeError("mega_kernel_profile: schedule must be callable or None (use "
                            "megamoe.profiler.schedule(...))")
        if on_trace_ready is not None and not callable(on_trace_ready):
            raise TypeError("mega_kernel_profile: on_trace_ready must be callable or None")
        if not isinstance(detailed_task_names, bool):
            raise TypeError("mega_kernel_profile: detailed_task_names must be bool")
        if (not isinstance(max_pending_calls, int) or isinstance(max_pending_calls, bool)
                or max_pending_calls <= 0):
            raise ValueError("mega_kernel_profile: max_pending_calls must be a positive "
                             f"integer, got {max_pending_calls!r}")
        self.schedule = schedule
        self.on_trace_ready = on_trace_ready
        self.detailed_task_names = detailed_task_names
        self.max_pending_calls = max_pending_calls
        self.dir = os.fspath(dir) if dir is not None else None
        self.step_num = 0
        self.cycle = 0            # windows made ready so far (the current one while in a handler)
        self.traces_ready = 0
        self.drains = 0           # intermediate drains (max_pending_calls) so far
        self._segments = []       # traces drained from the rings in the current window
        self._last_trace = None
        self._started = False
        self._entered = False
        self.current_action = self._action(0)

    def _action(self, step):
        if self.schedule is None:
            return ProfilerAction.RECORD
        action = self.schedule(step)
        if not isinstance(action, ProfilerAction):
            raise TypeError("mega_kernel_profile: the schedule must return "
                            f"megamoe.profiler.ProfilerAction, got {type(action).__name__}")
        return action

    # -- backend: the process-wide C profiler, drained into Python traces --
    def _set_started(self, on):
        if on and not self._started:
            _L.megamoe_profiler_reset()
            check(_L.megamoe_profiler_start())
        elif not on and self._started:
            check(_L.megamoe_profiler_stop())
        self._started = on

    @staticmethod
    def _pending():
        s = _Summary()
        check(_L.megamoe_profiler_get_summary(ctypes.byref(s)))
        return s.invocations

    def _take_segment(self):
        fd, path = tempfile.mkstemp(prefix="megamoe_window_", suffix=".json")
        os.close(fd)
        try:
            check(_L.megamoe_profiler_export(os.fsencode(path)))
            self._segments.append(_load_json(path))
        finally:
            os.unlink(path)
        _L.megamoe_profiler_reset()

    def _discard(self):
        _L.megamoe_profiler_reset()
        self._segments.clear()

    def _after_invocation(self):
        if self.current_action == ProfilerAction.NONE or not self._started:
            return
        if self._pending() < self.max_pending_calls:
            return
        if self.current_action == ProfilerAction.WARMUP:
            _L.megamoe_profiler_reset()  # warm-up launches are not part of the trace
        else:
            self._take_segment()
            self.drains += 1

    def _finalize(self):
        self._take_segment()
        trace = _merge_segments(self._segments)
        self._segments = []
        if self.detailed_task_names:
            trace = _detailed_names(trace)
        trace["megaKernelTrace"]["windowIndex"] = self.traces_ready
        trace["megaKernelTrace"]["detailedTaskNames"] = self.detailed_task_names
        self._last_trace = trace
        if self.on_trace_ready is not None:
            self.on_trace_ready(self)
        if self.dir is not None:
            trace_handler(self.dir)(self)
        self.traces_ready += 1
        self.cycle += 1

    def _has_data(self):
        return bool(self._segments) or self._pending() > 0

    def __enter__(self):
        global _active_profile
        if _active_profile is not None:
            raise RuntimeError("mega_kernel_profile: another profiling context is active in "
                               "this process (only one at a time)")
        _active_profile = self
        self._entered = True
        self.step_num = 0
        self.current_action = self._action(0)
        try:
            self._set_started(self.current_action != ProfilerAction.NONE)
        except BaseException:
            _active_profile = None
            self._entered = False
            raise
        return self

    def step(self):
        """Mark the end of a training step (once per step, not per layer or launch)."""
        if not self._entered:
            raise RuntimeError("mega_kernel_profile.step() outside the 'with' block")
        cur, nxt = self.current_action, self._action(self.step_num + 1)
        if cur == ProfilerAction.WARMUP:
            self._discard()
        elif cur == ProfilerAction.RECORD_AND_SAVE or (cur == ProfilerAction.RECORD and
                                                        nxt not in _RECORDING):
            self._finalize()
        self.step_num += 1
        self.current_action = nxt
        self._set_started(nxt != ProfilerAction.NONE)

    def __exit__(self, exc_type, exc, tb):
        global _active_profile
        try:
            if exc_type is None and self.current_action in _RECORDING and self._has_data():
                self._finalize()  # the window the block ended in
        finally:
            try:
                self._set_started(False)
            finally:
                self._segments = []  # an exception discards the partial window
                _L.megamoe_profiler_reset()
                self.current_action = ProfilerAction.NONE
                self._entered = False
                _active_profile = None
        return False

    # -- results: the last completed window (inside on_trace_ready, or after the block) --
    def _window(self):
        if self._last_trace is None:
            raise RuntimeError("mega_kernel_profile: no completed MegaKernel capture window is "
                               "available; call step() at the window boundary or leave the "
                               "context first")
        return self._last_trace

    def export_chrome_trace(self, path):
        """Write the last completed window's trace (every resource group's tracks) to path
        (parent directories created) and return it as a dict."""
        trace = self._window()
        path = os.fspath(path)
        parent = os.path.dirname(path)
        if parent:
            os.makedirs(parent, exist_ok=True)
        tmp = f"{path}.tmp{os.getpid()}"
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(trace, f, ensure_ascii=False)
        os.replace(tmp, path)
        return trace

    def export_chrome_trace_dir(self, dir_name):
        """Write ``<dir>/trace_<rank>.json`` (created if missing)."""
        trace = self._window()
        rank = trace["megaKernelTrace"].get("rank", 0)
        return self.export_chrome_trace(os.path.join(os.fspath(dir_name), f"trace_{rank}.json"))

    def summary(self):
        """Totals of the last completed window: wait/compute/signal ns, records, dropped,
        invocations, wait_share."""
        return _trace_summary(self._window())


# ---- your own spans ------------------------------------------------------------------------

class Session:
    """A profiling session of your own (one rank): its records join this process's traces.

    It records only while the process profiler records (``profiler.is_recording()``) unless
    you force ``active``; ``record`` spans use ``time.monotonic_ns()`` stamps.
    """

    def __init__(self, stages, cube_workers=1, vector_workers=1, records_per_worker=65536,
                 rank=None):
        self._names = [os.fsencode(s) if isinstance(s, str) else bytes(s) for s in stages]
        p = _lib.default(_Params)
        p.rank = -1 if rank is None else int(rank)
        p.cube_workers = int(cube_workers)
        p.vector_workers = int(vector_workers)
        p.records_per_worker = int(records_per_worker)
        self._c_names = (ctypes.c_char_p * max(1, len(self._names)))(*self._names)
        p.stage_names = self._c_names
        p.stage_count = len(self._names)
        h = _vp()
        check(_L.megamoe_profile_create(ctypes.byref(p), ctypes.byref(h)))
        self._handle = h
        self.stages = list(stages)

    def _h(self):
        if not self._handle:
            raise RuntimeError("profiler.Session is closed")
        return self._handle

    @property
    def active(self):
        return bool(_L.megamoe_profile_is_active(self._h()))

    @active.setter
    def active(self, value):
        _L.megamoe_profile_set_active(self._h(), 1 if value else 0)

    def begin(self, direction="forward"):
        inv = ctypes.c_uint32()
        check(_L.megamoe_profile_begin(self._h(), direction.encode(), ctypes.byref(inv)))
        return inv.value

    def end(self):
        check(_L.megamoe_profile_end(self._h()))
        _note_invocation()

    def record(self, role, worker, kind, stage, start_ns, end_ns, task=-1, owner=-1, peer=-1,
               invocation=0):
        if isinstance(stage, str):
            stage = self.stages.index(stage)
        r = _Record(int(start_ns), int(end_ns), int(kind), int(stage), int(task), int(owner),
                    int(peer), int(invocation))
        check(_L.megamoe_profile_record(self._h(), int(role), int(worker), ctypes.byref(r)))

    def summary(self):
        s = _Summary()
        check(_L.megamoe_profile_get_summary(self._h(), ctypes.byref(s)))
        return _summary_dict(s)

    def export_chrome_trace(self, path):
        check(_L.megamoe_profile_export(self._h(), os.fsencode(os.fspath(path))))

    def close(self):
        if self._handle:
            _L.megamoe_profile_destroy(self._handle)
            self._handle = _vp()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    def __del__(self):
        try:
            self.close()
        except Exception:  # pragma: no cover - interpreter shutdown
            pass


def is_recording():
    """True while the process profiler records (a context's active steps, or MEGAMOE_PROFILE)."""
    return bool(_L.megamoe_profiler_is_started())


def clock_ns():
    """The records' clock (CLOCK_MONOTONIC ns; equals time.monotonic_ns() on Linux)."""
    return int(_L.megamoe_profile_clock_ns())


def merge_traces(inputs, output):
    """``megamoe trace merge``: files or directories of trace_<rank>.json -> one trace."""
    arr, n = _paths(inputs)
    check(_L.megamoe_trace_merge(arr, n, os.fsencode(os.fspath(output))))


def render_svg(inputs, output, width=0, invocation=-1):
    """``megamoe trace svg``: the timeline picture of the traces."""
    arr, n = _paths(inputs)
    opts = _SvgOptions(int(width), int(invocation))
    check(_L.megamoe_trace_svg(arr, n, ctypes.byref(opts), os.fsencode(os.fspath(output))))


__all__ += ["is_recording", "clock_ns"]
