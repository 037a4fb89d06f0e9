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
    prof.export_chrome_trace("rank_trace.json")    # the last recorded cycle

Then ``megamoe trace merge traces -o merged.json`` puts every rank on one time axis and
``megamoe trace summary traces --svg timeline.svg`` prints per-stage statistics and draws the
timeline.

The schedule has torch.profiler's semantics: ``skip_first`` steps are ignored, then each cycle
is ``wait`` idle steps, ``warmup`` steps recorded and discarded, and ``active`` recorded steps;
after the last active step of a cycle the trace is ready (``on_trace_ready(prof)`` is called
and, with ``dir``, ``<dir>/trace_<rank>.json`` is written — later cycles go to
``<dir>/cycle_<k>/``). ``repeat=0`` repeats cycles until the context ends. Only one context may
be active per process (as in the original). Recording costs a few nanoseconds per task; with
no context (and no MEGAMOE_PROFILE) the executor pays one branch per task.

:class:`Session` records spans of your own on the same clock (CLOCK_MONOTONIC, as
``time.monotonic_ns()``) into the same traces.
"""
import ctypes
import enum
import os

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


class _Summary(ctypes.Structure):
    _fields_ = [("wait_ns", _u64), ("compute_ns", _u64), ("signal_ns", _u64),
                ("wall_ns", _u64), ("launch_ns", _u64), ("records", _u64), ("dropped", _u64),
                ("invocations", _u64), ("workers", ctypes.c_int), ("sessions", ctypes.c_int)]


class _Params(ctypes.Structure):
    _fields_ = [("rank", ctypes.c_int), ("cube_workers", ctypes.c_int),
                ("vector_workers", ctypes.c_int), ("records_per_worker", ctypes.c_uint32),
                ("stage_names", _P(ctypes.c_char_p)), ("stage_count", ctypes.c_int)]


class _Record(ctypes.Structure):
    _fields_ = [("start_ns", _u64), ("end_ns", _u64), ("kind", ctypes.c_int),
                ("stage", ctypes.c_int), ("task", ctypes.c_int32), ("owner", ctypes.c_int32),
                ("peer", ctypes.c_int), ("invocation", ctypes.c_uint32)]


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
_declare("megamoe_profile_params_default", _Params, [])
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


class mega_kernel_profile:
    """Record MegaKernel launches of this process by schedule; see the module docstring."""

    def __init__(self, schedule=None, on_trace_ready=None, dir=None):
        if schedule is None:
            schedule = globals()["schedule"](wait=0, warmup=0, active=1, repeat=1, skip_first=0)
        if not callable(schedule):
            raise TypeError("mega_kernel_profile: schedule must be callable (use "
                            "megamoe.profiler.schedule(...))")
        if on_trace_ready is not None and not callable(on_trace_ready):
            raise TypeError("mega_kernel_profile: on_trace_ready must be callable")
        self.schedule = schedule
        self.on_trace_ready = on_trace_ready
        self.dir = os.fspath(dir) if dir is not None else None
        self.step_num = 0
        self.cycle = 0            # traces made ready so far (the current one while in a handler)
        self.current_action = ProfilerAction.NONE
        self.traces_ready = 0
        self._entered = False

    # -- backend: the process-wide C profiler --
    @staticmethod
    def _start():
        check(_L.megamoe_profiler_start())

    @staticmethod
    def _stop():
        check(_L.megamoe_profiler_stop())

    @staticmethod
    def _reset():
        _L.megamoe_profiler_reset()

    def _trace_ready(self):
        if self.on_trace_ready is not None:
            self.on_trace_ready(self)
        if self.dir is not None:
            trace_handler(self.dir)(self)
        self.traces_ready += 1
        self.cycle += 1

    def _transition(self, prev, cur):
        A = ProfilerAction
        recording = (A.RECORD, A.RECORD_AND_SAVE)
        if prev == A.RECORD_AND_SAVE or (prev == A.RECORD and cur in (A.NONE, A.WARMUP)):
            self._stop()
            self._trace_ready()
            prev = A.NONE
        if prev == A.NONE and cur in (A.WARMUP,) + recording:
            self._reset()
            self._start()
        elif prev == A.WARMUP and cur in recording:
            self._reset()  # warm-up launches are not part of the trace
        elif prev == A.WARMUP and cur == A.NONE:
            self._stop()
            self._reset()

    def __enter__(self):
        global _active_profile
        if _active_profile is not None:
            raise RuntimeError("mega_kernel_profile: another profiling context is active in "
                               "this process (only one at a time)")
        _active_profile = self
        self._entered = True
        self.step_num = 0
        self.current_action = self.schedule(0)
        try:
            self._transition(ProfilerAction.NONE, self.current_action)
        except BaseException:
            _active_profile = None
            self._entered = False
            raise
        return self

    def step(self):
        """Mark the end of a training step."""
        if not self._entered:
            raise RuntimeError("mega_kernel_profile.step() outside the 'with' block")
        prev = self.current_action
        self.step_num += 1
        self.current_action = self.schedule(self.step_num)
        self._transition(prev, self.current_action)

    def __exit__(self, exc_type, exc, tb):
        global _active_profile
        try:
            A = ProfilerAction
            if self.current_action in (A.RECORD, A.RECORD_AND_SAVE):
                self._stop()
                self._trace_ready()
            elif self.current_action == A.WARMUP:
                self._stop()
                self._reset()
        finally:
            self.current_action = ProfilerAction.NONE
            self._entered = False
            _active_profile = None
        return False

    # -- results (inside on_trace_ready, or after the block: the last recorded cycle) --
    def export_chrome_trace(self, path):
        """Write this process's trace (every resource group's tracks) to path."""
        check(_L.megamoe_profiler_export(os.fsencode(os.fspath(path))))

    def export_chrome_trace_dir(self, dir_name):
        """Write ``<dir>/trace_<rank>.json`` (created if missing)."""
        check(_L.megamoe_profiler_export_dir(os.fsencode(os.fspath(dir_name))))

    def summary(self):
        """Totals of the recorded cycle: wait/compute/signal ns, records, dropped, wait_share."""
        s = _Summary()
        check(_L.megamoe_profiler_get_summary(ctypes.byref(s)))
        return _summary_dict(s)


# ---- your own spans ------------------------------------------------------------------------

class Session:
    """A profiling session of your own (one rank): its records join this process's traces.

    It records only while the process profiler records (``profiler.is_recording()``) unless
    you force ``active``; ``record`` spans use ``time.monotonic_ns()`` stamps.
    """

    def __init__(self, stages, cube_workers=1, vector_workers=1, records_per_worker=65536,
                 rank=None):
        self._names = [os.fsencode(s) if isinstance(s, str) else bytes(s) for s in stages]
        p = _L.megamoe_profile_params_default()
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
