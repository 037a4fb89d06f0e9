"""The one owner of the ``megamoe`` torch namespace: every ``torch.ops.megamoe.*`` operator is
defined here, from Python, with ``torch.library`` — the ``Library("megamoe", "DEF")`` form torch
1.13 has — plus what newer torch adds: fake kernels (``register_fake`` on 2.4+, ``impl_abstract``
on 2.2/2.3, a Meta kernel before), autograd (``register_autograd``, 2.4+) and ordered side
effects for collectives (2.4+). The Torch adapter (src/torch/, optional) only adds C++ CPU
kernels to operators defined here (megamoe/_adapter.py); it never defines one.

How to register an operator (docs/torch.md "Registering an operator"):

    from ._library import megamoe as _ops

    @_ops.define("my_op(Tensor? x, str group_ep, *, int k=1, Tensor(a!)? perf=None) -> Tensor",
                 fake=_my_op_fake, collective=True, normalize={"group_ep": group_name})
    def my_op(x, group_ep, *, k=1, perf=None):
        ...  # the CPU body: ctypes calls into libmegamoe; allocate outputs with device="cpu"

* The decorated function is the CPU body and its signature must equal the schema (names,
  keyword-only marks, defaults: checked here). It is registered for CompositeExplicitAutograd,
  so it also runs when no tensor is given or a tensor is not on the CPU: a collective body then
  reports the error on every rank (docs/ops.md "Collective rules") instead of the dispatcher
  raising on one. ``define`` returns an :class:`Operator`, the Python entry point
  (``megamoe.ops.my_op``): it binds and normalises the arguments, then calls the torch op.
* ``fake`` takes the same arguments and returns outputs of the right shapes and dtypes without
  touching data (``x.new_empty(...)``); it serves FakeTensor / torch.compile and meta tensors.
  Shapes that only data decides get :func:`dynamic_size`; symbolic input sizes may be made
  concrete with ``int()`` (a guard), e.g. to ask the C ``*_infer`` function.
* ``collective=True``: the op communicates, so no compiler pass may drop it (even when its
  results are unused) or reorder it against another collective; it is registered as an ordered
  side effect (effect tokens). Ops with in-place arguments (``Tensor(a!)``) get a functional
  twin ``_my_op`` (same arguments, those returned as extra outputs) that carries the effect;
  ``my_op`` itself is then a composite of the twin and ``copy_``. The body stays in place-style.
* Autograd: ``_ops.register_autograd("my_op", backward, setup_context=...)`` on torch >= 2.4
  (returns False before; wrap the op in a ``torch.autograd.Function`` there).
"""
import functools
import inspect
import re
import threading

import torch

from .errors import MegaMoeError

__all__ = ["megamoe", "OpNamespace", "Operator", "dynamic_size", "stand_in", "concrete", "faking",
           "FAKE_BY_BODY", "TORCH_VERSION", "HAS_FAKE", "HAS_AUTOGRAD", "HAS_EFFECTS",
           "HAS_COMPILE"]

TORCH_VERSION = tuple(int(x) for x in re.findall(r"\d+", torch.__version__)[:2])
_register_fake = getattr(torch.library, "register_fake", None)
_impl_abstract = getattr(torch.library, "impl_abstract", None)
HAS_FAKE = _register_fake is not None or _impl_abstract is not None
HAS_AUTOGRAD = TORCH_VERSION >= (2, 4) and hasattr(torch.library, "register_autograd")
HAS_COMPILE = hasattr(torch, "compile")
try:  # ordered side effects (effect tokens): torch >= 2.4
    from torch._higher_order_ops.effects import _EffectType, _register_effectful_op
    HAS_EFFECTS = TORCH_VERSION >= (2, 4)
except ImportError:  # pragma: no cover - depends on torch
    HAS_EFFECTS = False

_ERROR = re.compile(r"\[megamoe ([A-Z_]+) (-?\d+)\] (.*)", re.S)
_MUTABLE = re.compile(r"\(([a-z]+)!\)")


def _translate(exc):
    """The adapter's "[megamoe NAME code] message" errors as MegaMoeError; the schema binder's
    wrong-kind errors as TypeError (the ctypes body raises those too)."""
    m = _ERROR.match(str(exc))
    if m:
        return MegaMoeError(int(m.group(2)), m.group(3))
    if "Expected a value of type" in str(exc) or "expected a value of type" in str(exc):
        return TypeError(str(exc))
    return exc


def _is_tensor_type(arg):
    return str(arg.type) in ("Tensor", "Tensor?", "Optional[Tensor]")


def _schema_mismatch(fn, schema):
    """Differences between a body's Python signature and the schema ("" if none)."""
    params = list(inspect.signature(fn).parameters.values())
    if len(params) != len(schema.arguments):
        return f"{len(params)} Python parameters, {len(schema.arguments)} in the schema {schema}"
    for p, a in zip(params, schema.arguments):
        default = None if p.default is inspect.Parameter.empty else p.default
        has_default = p.default is not inspect.Parameter.empty
        if (p.name != a.name or (p.kind is inspect.Parameter.KEYWORD_ONLY) != a.kwarg_only
                or has_default != a.has_default_value()
                or (has_default and a.default_value != default)):
            return f"parameter {p.name!r} differs from the schema's {a}"
    return ""


def _functional_schema(schema_text, name, twin, mutable):
    """The functional twin's schema: no alias annotations, the mutated arguments returned."""
    head, _, returns = schema_text.partition("->")
    head = _MUTABLE.sub("", head).replace(f"{name}(", f"{twin}(", 1)
    returns = returns.strip()
    if returns.startswith("("):
        inner = returns[1:-1].strip()
        outs = [r.strip() for r in inner.split(",")] if inner else []
    else:
        outs = [returns]
    outs += ["Tensor"] * len(mutable)
    return f"{head.rstrip()} -> ({', '.join(outs)})"


class Operator:
    """A megamoe operator's Python entry point (what ``define`` returns): the body's signature,
    arguments normalised once (``normalize``), then ``torch.ops.megamoe.<name>``.

    Attributes: ``name``, ``qualname`` ("megamoe::name"), ``op`` (the torch OpOverload),
    ``body`` (the Python CPU body), ``fake``, ``collective``, ``mutable`` (in-place arguments),
    ``twin`` (the functional twin's OpOverload or None), ``backend`` ("torch" when the C++
    adapter supplies the CPU kernel, else "ctypes"), ``ctypes_path`` (the same entry point
    calling the Python body directly, for tests comparing the two)."""

    def __init__(self, space, name, schema, body, fake, collective, normalize):
        self.space = space
        self.name = name
        self.qualname = f"{space.ns}::{name}"
        self.schema = schema
        self.body = body
        self.fake = fake
        self.collective = collective
        self.normalize = dict(normalize or {})
        self.signature = inspect.signature(body)
        self.mutable = [a.name for a in schema.arguments
                        if a.alias_info is not None and a.alias_info.is_write]
        self.tensors = [a.name for a in schema.arguments if _is_tensor_type(a)]
        self.positional = [p.name for p in self.signature.parameters.values()
                           if p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD]
        self.names = list(self.signature.parameters)
        self.defaults = {p.name: p.default for p in self.signature.parameters.values()
                         if p.default is not inspect.Parameter.empty}
        self.keyword = [p.name for p in self.signature.parameters.values()
                        if p.kind is inspect.Parameter.KEYWORD_ONLY]
        self.twin = None
        self.adapter_kernel = False
        self.body_calls = 0  # runs of the Python body with real data (tests: nothing dropped)
        functools.update_wrapper(self, body)

    def _counted(self, body):
        @functools.wraps(body)
        def run(*args, **kwargs):
            self.body_calls += 1
            return body(*args, **kwargs)
        return run

    @property
    def op(self):
        return getattr(getattr(torch.ops, self.space.ns), self.name).default

    @property
    def backend(self):
        return "torch" if self.adapter_kernel else "ctypes"

    def _bind(self, args, kwargs):
        """The arguments by name with the defaults applied (plain Python rather than
        inspect.Signature.bind, so torch.compile traces it without a graph break)."""
        if len(args) > len(self.positional):
            raise TypeError(f"{self.name}() takes {len(self.positional)} positional arguments "
                            f"but {len(args)} were given")
        a = dict(zip(self.positional, args))
        for name, value in kwargs.items():
            if name not in self.defaults and name not in self.positional:
                raise TypeError(f"{self.name}() got an unexpected keyword argument '{name}'")
            if name in a:
                raise TypeError(f"{self.name}() got multiple values for argument '{name}'")
            a[name] = value
        for name in self.names:
            if name not in a:
                if name not in self.defaults:
                    raise TypeError(f"{self.name}() missing required argument: '{name}'")
                a[name] = self.defaults[name]
        for name, norm in self.normalize.items():
            if name in a:
                a[name] = norm(a[name])
        return a

    def _split(self, a):
        return [a[n] for n in self.positional], {n: a[n] for n in self.keyword}

    def __call__(self, *args, **kwargs):
        a = self._bind(args, kwargs)
        pos, kw = self._split(a)
        # A value of the wrong kind in a tensor slot (the schema binder would raise on this rank
        # only while the peers wait in the collective), or tensors off the CPU (another kernel
        # would run, or none): the body refuses them on every rank. Only meta tensors (every
        # one of them) get the fake kernel: shapes and dtypes without data.
        devices = set()
        for n in self.tensors:
            t = a[n]
            if t is not None:
                if not isinstance(t, torch.Tensor):
                    return self.body(*pos, **kw)
                devices.add(t.device.type)
        if devices - {"cpu"} and devices != {"meta"}:
            return self.body(*pos, **kw)
        try:
            if self.twin is None:
                return self.op(*pos, **kw)
            outs = self.twin(*pos, **kw)
        except RuntimeError as exc:
            err = _translate(exc)
            if err is exc:
                raise
            raise err from None
        return self._copy_back(a, outs)

    def _copy_back(self, a, outs):
        n = len(outs) - len(self.mutable)
        for name, value in zip(self.mutable, outs[n:]):
            if a[name] is not None:
                a[name].copy_(value)
        outs = outs[:n]
        return outs[0] if len(outs) == 1 else (tuple(outs) if outs else None)

    def ctypes_path(self, *args, **kwargs):
        """The body itself (no dispatcher, no adapter), after the same normalisation."""
        pos, kw = self._split(self._bind(args, kwargs))
        return self.body(*pos, **kw)

    def __repr__(self):
        return f"<megamoe operator {self.qualname}>"


class OpNamespace:
    """A torch.library namespace megamoe owns (``megamoe``; tests make their own)."""

    def __init__(self, ns):
        self.ns = ns
        self.lib = torch.library.Library(ns, "DEF")
        self.operators = {}

    def _impl(self, name, fn, key):
        self.lib.impl(name, fn, key)

    def _fake(self, name, fn):
        qualname = f"{self.ns}::{name}"
        if _register_fake is not None:
            _register_fake(qualname, fn, lib=self.lib)
        elif _impl_abstract is not None:  # pragma: no cover - torch 2.2 / 2.3
            _impl_abstract(qualname, fn, lib=self.lib)
        else:  # torch < 2.2: meta tensors run the fake kernel (1.13 has no autograd
            # fallthrough for Python-defined operators on meta tensors: the same kernel there)
            self._impl(name, fn, "Meta")
            self._impl(name, fn, "AutogradMeta")

    def _effect(self, name):
        if HAS_EFFECTS:
            _register_effectful_op(getattr(getattr(torch.ops, self.ns), name).default,
                                   _EffectType.ORDERED)

    def define(self, schema, *, fake=None, collective=False, normalize=None):
        """Decorator: define ``schema`` with the decorated CPU body (see the module docstring)."""

        def wrap(body):
            parsed = torch._C.parse_schema(f"{self.ns}::{schema}")
            name = parsed.name.split("::")[-1]
            if name in self.operators:
                raise RuntimeError(f"{self.ns}::{name} is defined twice")
            nonlocal fake
            if fake == FAKE_BY_BODY:
                fake = _fake_by_body(body)
            problem = _schema_mismatch(body, parsed)
            if problem:
                raise TypeError(f"{self.ns}::{name}: the body's signature does not match the "
                                f"schema: {problem}")
            op = Operator(self, name, parsed, body, fake, collective, normalize)
            self.lib.define(schema)
            if op.mutable:
                self._define_twin(op, schema)
            else:
                self._impl(name, op._counted(body), "CompositeExplicitAutograd")
                if fake is not None:
                    self._fake(name, fake)
                if collective:
                    self._effect(name)
            self.operators[name] = op
            return op

        return wrap

    def _define_twin(self, op, schema):
        """In-place arguments: the functional twin ``_name`` (returns the mutated arguments) has
        the body and the fake; ``name`` is the twin plus copy_ (CompositeImplicitAutograd)."""
        twin = f"_{op.name}"
        self.lib.define(_functional_schema(schema, op.name, twin, op.mutable))
        body, fake, mutable = op.body, op.fake, op.mutable
        sig = op.signature
        params = list(sig.parameters)

        def functional_body(*args, **kwargs):
            bound = sig.bind(*args, **kwargs)
            bound.apply_defaults()
            a = bound.arguments
            copies = []
            for n in mutable:
                t = a[n]
                if isinstance(t, torch.Tensor):
                    t = t.clone(memory_format=torch.contiguous_format)
                    a[n] = t
                copies.append(t if isinstance(t, torch.Tensor)
                              else torch.empty(0, dtype=torch.float32, device="cpu"))
            outs = body(*[a[p] for p in params if p in op.positional],
                        **{k: a[k] for k in op.keyword})
            outs = outs if isinstance(outs, tuple) else (outs,)
            return tuple(outs) + tuple(copies)

        def functional_fake(*args, **kwargs):
            bound = sig.bind(*args, **kwargs)
            bound.apply_defaults()
            a = bound.arguments
            outs = fake(*[a[p] for p in params if p in op.positional],
                        **{k: a[k] for k in op.keyword})
            outs = outs if isinstance(outs, tuple) else (outs,)
            like = next((a[n] for n in op.tensors if isinstance(a[n], torch.Tensor)), None)
            extra = []
            for n in mutable:
                t = a[n]
                if isinstance(t, torch.Tensor):
                    extra.append(torch.empty_like(t, memory_format=torch.contiguous_format))
                elif like is not None:
                    extra.append(like.new_empty(0, dtype=torch.float32))
                else:
                    extra.append(torch.empty(0, dtype=torch.float32, device="cpu"))
            return tuple(outs) + tuple(extra)

        def composite(*args, **kwargs):
            bound = sig.bind(*args, **kwargs)
            bound.apply_defaults()
            pos, kw = op._split(bound.arguments)
            outs = getattr(getattr(torch.ops, self.ns), twin)(*pos, **kw)
            return op._copy_back(bound.arguments, outs)

        self._impl(twin, op._counted(functional_body), "CompositeExplicitAutograd")
        if fake is not None:
            self._fake(twin, functional_fake)
        self._impl(op.name, composite, "CompositeImplicitAutograd")
        if op.collective:
            self._effect(twin)
        op.twin_name = twin
        op.twin = getattr(getattr(torch.ops, self.ns), twin).default

    def register_autograd(self, name, backward, *, setup_context):
        """torch.library.register_autograd for ``name`` on torch >= 2.4; False before (the caller
        then wraps the op in a torch.autograd.Function)."""
        if not HAS_AUTOGRAD:
            return False
        torch.library.register_autograd(f"{self.ns}::{name}", backward,
                                        setup_context=setup_context, lib=self.lib)
        return True

    def kernel_name(self, name):
        """The op that carries the CPU kernel: the functional twin for in-place ops."""
        op = self.operators[name]
        return getattr(op, "twin_name", name)


def dynamic_size(*, min=0, max=None):
    """In a fake kernel: a size that only the data decides (an unbacked SymInt under
    FakeTensorMode, torch >= 2.2). Meta tensors on older torch get ``max`` (the upper bound the
    real kernel never exceeds), which must then be given."""
    get_ctx = getattr(torch.library, "get_ctx", None)
    if get_ctx is None:
        try:  # torch 2.2 / 2.3
            from torch._library.abstract_impl import get_ctx
        except ImportError:
            get_ctx = None
    if get_ctx is not None:
        try:
            ctx = get_ctx()
        except Exception:  # noqa: BLE001 - not inside a fake kernel (meta tensors)
            ctx = None
        if ctx is not None:
            return ctx.new_dynamic_size(min=min, max=max)
    if max is None:
        raise RuntimeError("dynamic_size: this torch has no unbacked sizes; give max=")
    return max


def stand_in(nbytes):
    """Zeroed bytes standing in for a fake tensor's data: the C ``*_infer`` functions may read
    inputs they validate (NaN checks, elastic_info), so a descriptor of a fake tensor points at
    zeros of the right size rather than at nothing. Keep the buffer alive while it is used."""
    import ctypes
    return ctypes.create_string_buffer(max(64, int(nbytes)))


def concrete(size):
    """An int from a (possibly symbolic) size: a guard on a backed SymInt, so the C infer
    function sees real numbers (the graph specialises on that size)."""
    return int(size)


_state = threading.local()


def faking():
    """True inside a fake kernel made from the body (``fake=FAKE_BY_BODY``): the body then
    describes shapes to the C infer function and allocates outputs, but calls nothing."""
    return getattr(_state, "faking", False)


class _Faking:
    def __enter__(self):
        self.before = faking()
        _state.faking = True

    def __exit__(self, *exc):
        _state.faking = self.before


FAKE_BY_BODY = "body"  # fake=FAKE_BY_BODY: the body is its own fake kernel (see faking())


def _fake_by_body(body):
    @functools.wraps(body)
    def fake(*args, **kwargs):
        with _Faking():
            return body(*args, **kwargs)
    return fake


megamoe = OpNamespace("megamoe")
