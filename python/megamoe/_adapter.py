"""Backend selection: the Torch adapter (``torch.ops.megamoe.*``) when present, ctypes otherwise.

The adapter is ``libmegamoe_torch.so`` (src/torch/), an ordinary shared library loaded with
``torch.ops.load_library()``; it registers the operators with schemas, so TorchScript can call
them. It is looked for next to the libmegamoe.so that ``_lib`` loaded (the wheel's
``megamoe/_native/``, an installed ``lib/``, or the build tree's ``src/torch/``) and used only if
it resolved the very same library (one runtime per process) and has the same ABI.
``MEGAMOE_TORCH_ADAPTER``: ``auto`` (default; ctypes when absent), ``on`` (ImportError when it
cannot be used), ``off`` (ctypes only).

The seam, one copy of the argument handling for both backends:

* ``operator(normalize)`` decorates a megamoe.ops wrapper: the wrapper's signature is the API (the
  adapter's schema must equal it, checked when the adapter loads); each call binds the arguments,
  applies the defaults, normalises the Python-only kinds (process groups -> communicator names,
  fp8 tokens -> dtype codes) and calls either ``torch.ops.megamoe.<name>`` or the wrapper's own
  ctypes body with those same arguments.
* ``ops`` is ``torch.ops.megamoe`` or None; MegaMoeExperts passes the same tensors either way.
* ``call(fn, *args)`` runs an adapter op and turns its "[megamoe NAME code] message" errors back
  into :class:`MegaMoeError`.
"""
import ctypes
import functools
import inspect
import os
import re
import warnings

import torch

from . import _lib
from .errors import MegaMoeError

__all__ = ["ops", "path", "operator", "call", "register_group", "signed64"]

_ADAPTER = "libmegamoe_torch.so"
_MODES = ("auto", "on", "off")
_ERROR = re.compile(r"\[megamoe ([A-Z_]+) (-?\d+)\] (.*)", re.S)


def _candidates():
    here = os.path.dirname(_lib.path)
    if here:
        yield os.path.join(here, _ADAPTER)            # wheel payload, installed lib/
        yield os.path.join(here, "torch", _ADAPTER)   # build tree: <build>/src/torch/


def _load():
    text = os.environ.get("MEGAMOE_TORCH_ADAPTER", "")
    mode = text.lower() or "auto"
    if mode not in _MODES:
        raise ImportError(f"MEGAMOE_TORCH_ADAPTER='{text}' is not accepted; use one of "
                          f"{'|'.join(_MODES)}")
    if mode == "off":
        return None, None
    problems = []
    for p in _candidates():
        if not os.path.exists(p):
            problems.append(f"{p}: not found")
            continue
        try:
            torch.ops.load_library(p)
        except (OSError, RuntimeError) as exc:
            problems.append(f"{p}: {exc}")
            continue
        lib = torch.ops.megamoe
        mine = ctypes.cast(_lib.lib.megamoe_version, ctypes.c_void_p).value
        if lib.library_id() != mine:
            problems.append(f"{p}: resolved another libmegamoe than {_lib.path}")
        elif lib.abi_version() != _lib.ABI_VERSION:
            problems.append(f"{p}: ABI {lib.abi_version()}, the binding has {_lib.ABI_VERSION}")
        else:
            return lib, p
    message = ("megamoe: the Torch adapter cannot be used (torch.ops.megamoe is missing; the "
               "binding falls back to ctypes). Build it with libtorch-dev installed ('make deps', "
               "'make build') or set MEGAMOE_TORCH_ADAPTER=off.\n  " + "\n  ".join(problems))
    if mode == "on":
        raise ImportError(message)
    if any("not found" not in p for p in problems):
        warnings.warn(message, RuntimeWarning, stacklevel=3)  # present but unusable
    return None, None


ops, path = _load()


def signed64(value):
    """A uint64 (e.g. the weights version) as the int64 a schema ``int`` carries."""
    value &= 0xFFFFFFFFFFFFFFFF
    return value - (1 << 64) if value >= (1 << 63) else value


def _translate(exc):
    m = _ERROR.match(str(exc))
    return MegaMoeError(int(m.group(2)), m.group(3)) if m else exc


def call(fn, *args, **kwargs):
    """Run an adapter op; library errors raise MegaMoeError and arguments of the wrong kind
    TypeError, as on the ctypes path."""
    try:
        return fn(*args, **kwargs)
    except RuntimeError as exc:
        err = _translate(exc)
        if err is exc and "Expected a value of type" in str(exc):  # the schema's binder
            err = TypeError(str(exc))
        if err is exc:
            raise
        raise err from None


def register_group(name, handle):
    """megamoe.comm names its communicators; the adapter resolves group_ep/group_tp by name."""
    if ops is not None:
        ops.register_group(name, int(handle or 0))


def _schema_mismatch(fn, op):
    """Differences between a wrapper's Python signature and the adapter's schema ("" if none)."""
    schema = op.default._schema
    params = list(inspect.signature(fn).parameters.values())
    if len(params) != len(schema.arguments):
        return (f"{len(params)} Python parameters, {len(schema.arguments)} in the schema "
                f"{schema}")
    for p, a in zip(params, schema.arguments):
        default = None if p.default is inspect.Parameter.empty else p.default
        has_default = p.default is not inspect.Parameter.empty
        if (p.name != a.name or (p.kind is inspect.Parameter.KEYWORD_ONLY) != a.kwarg_only
                or has_default != a.has_default_value()
                or (has_default and a.default_value != default)):
            return f"parameter {p.name!r} differs from the schema's {a}"
    return ""


def operator(normalize):
    """Decorator for the megamoe.ops wrappers (see the module docstring). ``normalize`` maps
    parameter names to the function that turns a user value into what both backends take."""

    def wrap(fn):
        sig = inspect.signature(fn)
        positional = [p.name for p in sig.parameters.values()
                      if p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD]
        keyword = [p.name for p in sig.parameters.values()
                   if p.kind is inspect.Parameter.KEYWORD_ONLY]
        op = getattr(ops, fn.__name__, None) if ops is not None else None
        if op is not None:
            problem = _schema_mismatch(fn, op)
            if problem:
                warnings.warn(f"megamoe: torch.ops.megamoe.{fn.__name__} does not match "
                              f"megamoe.ops ({problem}); using ctypes for it", RuntimeWarning)
                op = None
        # tensor parameters: a value that is no CPU tensor is refused by the ctypes body on
        # every rank together (it still makes the collective call, docs/ops.md); the adapter
        # would raise on this rank only, so such a call takes the ctypes body
        tensors = [x.name for x in op.default._schema.arguments
                   if str(x.type) in ("Tensor", "Tensor?", "Optional[Tensor]")] if op else []

        def make(run):
            @functools.wraps(fn)
            def wrapper(*args, **kwargs):
                bound = sig.bind(*args, **kwargs)
                bound.apply_defaults()
                a = bound.arguments
                for name, norm in normalize.items():
                    if name in a:
                        a[name] = norm(a[name])
                go = run
                if run is not fn and any(
                        a[n] is not None and (not isinstance(a[n], torch.Tensor)
                                              or a[n].device.type != "cpu") for n in tensors):
                    go = fn
                return go(*[a[n] for n in positional], **{n: a[n] for n in keyword})
            return wrapper

        wrapper = make((lambda *a, **k: call(op, *a, **k)) if op is not None else fn)
        wrapper.backend = "torch" if op is not None else "ctypes"
        wrapper.ctypes_path = make(fn)  # the same wrapper on ctypes, for tests comparing both
        return wrapper

    return wrap
