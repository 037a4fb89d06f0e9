"""The torch.library registration (python/megamoe/_library.py), on the torch of the interpreter
(1.13 in `make test`, 2.6 in `make test-debian13`): one Python owner of the megamoe namespace,
bodies checked against their schemas, functional twins for in-place operators, fake kernels on
meta / fake tensors, data-dependent sizes, ordered side effects and torch.compile (torch >= 2.4).
Operators that communicate are checked on two ranks in library_worker.py (test at the end)."""
import itertools
import json
import os
import sys

import pytest
import torch

import megamoe
import megamoe.ops as ops
from megamoe import _dtypes, _library
from megamoe._library import OpNamespace
from conftest import run_megamoe

HERE = os.path.dirname(os.path.abspath(__file__))
WORKER = os.path.join(HERE, "library_worker.py")
_names = itertools.count()
NEEDS_COMPILE = pytest.mark.skipif(
    not (_library.HAS_AUTOGRAD and _library.HAS_EFFECTS and _library.HAS_COMPILE),
    reason=f"torch {torch.__version__}: torch.compile of custom operators needs torch >= 2.4 "
           "(`make test-debian13` runs it on torch 2.6)")

# every operator megamoe defines (the functional twins of the in-place ones come with them)
OPERATORS = ("npu_moe_distribute_dispatch_v2", "npu_moe_distribute_combine_v2",
             "npu_moe_distribute_combine_add_rms_norm", "npu_moe_distribute_dispatch",
             "npu_moe_distribute_combine", "experts_forward", "experts_backward")


def space():
    return OpNamespace(f"megamoe_selftest{next(_names)}")


def test_megamoe_defines_its_operators_from_python():
    assert set(OPERATORS) <= set(_library.megamoe.operators)
    for name in OPERATORS:
        op = _library.megamoe.operators[name]
        dump = torch._C._dispatch_dump(f"megamoe::{name}")
        schema_line = next(line for line in dump.splitlines() if line.startswith("schema:"))
        assert "megamoe_torch.cpp" not in schema_line, schema_line  # never the C++ adapter
        assert op.collective
        assert getattr(torch.ops.megamoe, name).default._schema == op.schema
    for name in ("npu_moe_distribute_dispatch_v2", "npu_moe_distribute_combine_v2"):
        op = _library.megamoe.operators[name]
        assert op.mutable == ["performance_info"]
        twin = op.twin._schema
        assert twin.name == f"megamoe::_{name}"
        assert len(twin.returns) == len(op.schema.returns) + 1
        assert all(a.alias_info is None for a in twin.arguments)


def test_the_entry_points_are_the_operators():
    assert ops.npu_moe_distribute_dispatch_v2.op is \
        torch.ops.megamoe.npu_moe_distribute_dispatch_v2.default
    assert megamoe.ops.moe_distribute_dispatch is ops.npu_moe_distribute_dispatch
    assert repr(ops.npu_moe_distribute_combine_v2) == \
        "<megamoe operator megamoe::npu_moe_distribute_combine_v2>"


def test_a_body_must_match_its_schema():
    s = space()
    with pytest.raises(TypeError, match="does not match the schema"):
        @s.define("f(Tensor x, int k=2) -> Tensor")
        def f(x, k=3):
            return x
    with pytest.raises(TypeError, match="does not match the schema"):
        @s.define("g(Tensor x, *, int k=2) -> Tensor")
        def g(x, k=2):  # k must be keyword-only
            return x


def test_an_in_place_operator_gets_a_functional_twin():
    s = space()

    def fake(x, k=1, *, acc=None):
        return torch.empty_like(x)

    @s.define("bump(Tensor x, int k=1, *, Tensor(a!)? acc=None) -> Tensor", fake=fake,
              collective=True)
    def bump(x, k=1, *, acc=None):
        if acc is not None:
            acc.add_(k)
        return x + k

    ns = getattr(torch.ops, s.ns)
    acc = torch.zeros(3, dtype=torch.int64)
    assert torch.equal(bump(torch.ones(2), 2, acc=acc), torch.full((2,), 3.0))
    assert acc.tolist() == [2, 2, 2]
    assert torch.equal(ns.bump(torch.ones(2), acc=acc), torch.full((2,), 2.0))  # the composite
    assert acc.tolist() == [3, 3, 3]
    strided = torch.zeros(6, dtype=torch.int64)
    bump(torch.ones(1), 5, acc=strided[::2])
    assert strided.tolist() == [5, 0, 5, 0, 5, 0]
    out, new_acc = ns._bump(torch.ones(2), 1, acc=acc)  # the twin: functional
    assert acc.tolist() == [3, 3, 3] and new_acc.tolist() == [4, 4, 4]
    assert bump.body_calls == 4
    meta = ns._bump(torch.ones(2, device="meta"), acc=torch.zeros(3, device="meta"))
    assert [t.device.type for t in meta] == ["meta", "meta"]
    assert bump.ctypes_path(torch.ones(1), 1).tolist() == [2.0]


def test_the_body_can_be_its_own_fake_kernel():
    s = space()

    @s.define("double(Tensor? x) -> Tensor", fake=_library.FAKE_BY_BODY)
    def double(x):
        out = torch.empty(x.shape[0] * 2, dtype=x.dtype,
                          device=x.device if _library.faking() else "cpu")
        if not _library.faking():
            out.copy_(torch.cat([x, x]))
        return out

    assert double(torch.arange(3.0)).tolist() == [0, 1, 2, 0, 1, 2]
    m = double(torch.zeros(5, device="meta"))
    assert m.device.type == "meta" and m.shape == (10,)
    assert double.body_calls == 1


def test_tensors_off_the_cpu_and_wrong_kinds_reach_the_body():
    """Mixed devices or a non-tensor in a tensor slot go to the body (which refuses them on
    every rank of a collective); only an all-meta call gets the fake kernel."""
    s = space()
    seen = []

    @s.define("pair(Tensor? a, Tensor? b) -> Tensor", fake=lambda a, b: torch.empty_like(a))
    def pair(a, b):
        seen.append((type(a).__name__, getattr(a, "device", None)))
        return torch.zeros(1)

    pair([1.0], torch.ones(1))
    pair(torch.ones(1, device="meta"), torch.ones(1))
    assert pair(torch.ones(1, device="meta"), torch.ones(1, device="meta")).device.type == "meta"
    pair(None, None)  # no tensor at all: CompositeExplicitAutograd still reaches the body
    assert [k for k, _ in seen] == ["list", "Tensor", "NoneType"]


def test_dynamic_size_in_a_fake_kernel():
    s = space()

    def fake(x):
        return x.new_empty(_library.dynamic_size(max=x.shape[0]))

    @s.define("nonzero_values(Tensor x) -> Tensor", fake=fake)
    def nonzero_values(x):
        return x[x != 0].clone()

    assert nonzero_values(torch.tensor([0.0, 1.0, 0.0, 2.0])).tolist() == [1.0, 2.0]
    if _library.TORCH_VERSION >= (2, 2):
        from torch._subclasses.fake_tensor import FakeTensorMode
        from torch.fx.experimental.symbolic_shapes import ShapeEnv
        with FakeTensorMode(shape_env=ShapeEnv()) as mode:
            out = getattr(torch.ops, s.ns).nonzero_values(mode.from_tensor(torch.ones(4)))
        assert isinstance(out.shape[0], torch.SymInt)  # unbacked: only the data decides
    else:  # meta tensors: the bound
        out = getattr(torch.ops, s.ns).nonzero_values(torch.ones(4, device="meta"))
        assert out.shape == (4,)


def test_dtypes():
    assert _dtypes.npu_code(torch.bfloat16) == 15 and _dtypes.npu_code(torch.int8) == 1
    assert _dtypes.npu_code(megamoe.float8_e4m3fn) == 24
    assert _dtypes.npu_code(megamoe.float8_e5m2) == 23
    assert _dtypes.npu_code(292) == 292 and _dtypes.npu_code(None) is None
    assert _dtypes.npu_code(torch.float64) == -1
    assert _dtypes.from_npu_code(292) == _dtypes.E4M3 == _dtypes.from_npu_code(24)
    assert _dtypes.from_npu_code(293) == _dtypes.E8M0
    assert _dtypes.from_npu_code(7) == _dtypes.INVALID  # float64: megamoe has none
    assert _dtypes.torch_dtype(_dtypes.E8M0) is torch.uint8  # torch_npu's form, every torch
    if hasattr(torch, "float8_e4m3fn"):
        assert _dtypes.FP8_TORCH
        assert _dtypes.torch_dtype(_dtypes.E4M3) is torch.float8_e4m3fn
        assert _dtypes.torch_dtype(_dtypes.E5M2) is torch.float8_e5m2
        assert _dtypes.code_of(torch.float8_e4m3fn) == _dtypes.E4M3
    else:
        assert _dtypes.torch_dtype(_dtypes.E4M3) is torch.uint8
    if hasattr(torch, "float8_e8m0fnu"):  # torch >= 2.7
        assert _dtypes.npu_code(torch.float8_e8m0fnu) == 293


@NEEDS_COMPILE
def test_collective_operators_are_ordered_side_effects():
    from torch._higher_order_ops.effects import SIDE_EFFECTS
    for name in OPERATORS:
        op = _library.megamoe.operators[name]
        carrier = op.twin if op.twin is not None else op.op
        assert carrier in SIDE_EFFECTS, name


@NEEDS_COMPILE
@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_compile_keeps_every_collective_call(backend):
    """fullgraph=True traces the operators; a collective whose results are unused still runs,
    and in program order (what every rank must agree on)."""
    s = space()
    order = []

    @s.define("coll(Tensor x, int tag) -> Tensor", fake=lambda x, tag: torch.empty_like(x),
              collective=True)
    def coll(x, tag):
        order.append(tag)
        return x + tag

    def f(x):
        coll(x, 1)                 # unused
        a = coll(x, 2)
        b = coll(x * 2, 3)         # independent of a
        return a + b

    torch._dynamo.reset()
    g = torch.compile(f, backend=backend, fullgraph=True)
    x = torch.ones(4)
    assert torch.equal(g(x), f(x))
    order.clear()
    g(x)
    assert order == [1, 2, 3]


def test_operators_on_two_ranks(tmp_path, megamoe_bin):
    """library_worker.py: fake kernels equal the real outputs' shapes and dtypes, opcheck on
    every operator, torch.compile of dispatch+combine, fp8 round trips, set_default_device and
    inference mode — each check where the torch of the interpreter has the feature."""
    prefix = str(tmp_path / "library")
    env = {"PYTHONPATH": os.path.join(HERE, "..", "..", "python"),
           "HYPER_PARALLEL_SHMEM_HEAP_SIZE": "256M", "MEGAMOE_LOG_LEVEL": "off"}
    r = run_megamoe(["launch", "-n", "2", "--timeout", "600", "--", sys.executable, WORKER,
                     prefix], env_extra=env, timeout=660)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    expected = {"fake_shapes", "inference_mode"}
    if _library.TORCH_VERSION >= (2, 0):
        expected |= {"default_device"}
    if hasattr(torch, "float8_e4m3fn"):
        expected |= {"fp8_round_trip"}
    if _library.HAS_AUTOGRAD and _library.HAS_EFFECTS:
        expected |= {"opcheck", "compile_round_trip", "fake_tensor_mode"}
    for rank in range(2):
        path = f"{prefix}.{rank}.json"
        assert os.path.exists(path), f"rank {rank} wrote no results:\n{r.stdout[-3000:]}"
        res = json.load(open(path))
        bad = {k: v for k, v in res.items() if v != "ok"}
        assert not bad, f"rank {rank}: " + "\n".join(f"{k}: {v}" for k, v in bad.items())
        assert set(res) == expected, sorted(res)
