"""torch_npu's companion operators between dispatch and combine, on megamoe's C kernels.

``npu_grouped_matmul``, ``npu_swiglu`` (with autograd), ``npu_clipped_swiglu``,
``npu_dynamic_quant``, ``npu_dequant_swiglu_quant``, ``npu_grouped_matmul_swiglu_quant`` and
``_v2`` with torch_npu's exact signatures, keyword spellings, defaults, dtypes and outputs (the
routing operators are in companion_routing.py); re-exported by :mod:`megamoe.ops`, so a caller
swaps ``torch_npu`` for ``megamoe.ops``. Semantics and the CPU-specific rules (rows past a
group list's total are zero, tie rounding, int64-coded scales, ...): docs/ops.md "Companion
operators". Every operator is local (no communication) and uses ``torch.get_num_threads()``
threads, like torch's own operators.

Every operator is ``torch.ops.megamoe.<name>`` too (megamoe/_library.py: torch_npu's schema,
a fake kernel for FakeTensor / meta tensors and torch.compile, autograd where torch_npu has it);
``OPERATORS`` maps each name to its Python entry point (what megamoe.ops exports).
"""
import ctypes
import os
import weakref

import torch

from . import _companion_c as _c
from . import _dtypes
from ._library import FAKE_BY_BODY, HAS_AUTOGRAD, dynamic_size, faking
from ._library import megamoe as _megamoe
from .errors import check

__all__ = ["npu_grouped_matmul", "npu_swiglu", "npu_clipped_swiglu", "npu_dynamic_quant",
           "npu_dequant_swiglu_quant", "npu_grouped_matmul_swiglu_quant",
           "npu_grouped_matmul_swiglu_quant_v2"]

OPERATORS = {}  # name -> the Python entry point megamoe.ops exports


def _register(schema, normalize=None, fake=FAKE_BY_BODY):
    """Define torch.ops.megamoe.<name> with torch_npu's schema and the decorated body (a local
    operator: no side effects). The body is its own fake kernel unless ``fake`` is given:
    under ``faking()`` _companion_c.Call calls nothing and the body skips its data reads."""
    def wrap(body):
        op = _megamoe.define(schema, fake=fake, collective=False, normalize=normalize)(body)
        OPERATORS[op.name] = op
        return op
    return wrap


def _tensor_list(v):
    """A Tensor[] argument: one tensor is a one-element list (torch_npu takes lists)."""
    if v is None:
        return None
    if isinstance(v, torch.Tensor):
        return [v]
    return list(v)


def _dtype_arg(op, name, v):
    """A dtype argument as a torch dtype: torch_npu's integer codes (what the schemas' ``int?``
    carry, megamoe/_dtypes.py) or a torch dtype; None stays None. A code megamoe has no type
    for is refused naming the argument."""
    if v is None or isinstance(v, torch.dtype):
        return v
    code = _dtypes.from_npu_code(v)
    if code == _dtypes.INVALID:
        raise ValueError(f"{op}: {name}={v!r} is not a dtype code megamoe knows")
    return _dtypes.torch_dtype(code)


_DTYPE = _dtypes.npu_code


def _check_none(op, **kwargs):
    for name, value in kwargs.items():
        if value is not None:
            raise ValueError(f"{op}: {name} is reserved by torch_npu and must be None")


def _group_counts(op, group_list, group_list_type, groups, rows):
    """Per-group row counts (an int64 tensor) of a group list (the C decoder's rules)."""
    g = group_list.to(torch.int64) if group_list.dtype != torch.int64 else group_list
    if group_list_type == 0:
        counts = torch.diff(g.reshape(-1), prepend=g.new_zeros(1))
    elif group_list_type == 1:
        counts = g.reshape(-1)
    elif group_list_type == 2:
        counts = torch.zeros(groups, dtype=torch.int64)
        used = g[:, 1] > 0
        counts.index_add_(0, g[used, 0], g[used, 1])
    else:
        raise ValueError(f"{op}: group_list_type {group_list_type}; use 0, 1 or 2")
    return counts


# ---- npu_grouped_matmul ------------------------------------------------------------------------

_ACT = {0: None, 1: torch.nn.functional.relu,
        2: lambda t: torch.nn.functional.gelu(t, approximate="tanh"),
        4: lambda t: t * torch.sigmoid(1.702 * t),  # fast-gelu
        5: torch.nn.functional.silu}


def _one(op, name, value, index):
    """Entry `index` of a torch_npu per-group parameter list (None / [] -> None)."""
    if value is None:
        return None
    if isinstance(value, torch.Tensor):
        return value
    value = list(value)
    if not value:
        return None
    return value[index] if index < len(value) else None


def _stack_param(op, name, value, groups):
    """A per-group parameter as one [E, ...] tensor: [t] with t [E, N], or E tensors [N] (the
    weight-list form)."""
    if value is None:
        return None
    if isinstance(value, torch.Tensor):
        return value
    value = [v for v in value if v is not None]
    if not value:
        return None
    if len(value) == 1:
        return value[0]
    if len(value) != groups:
        raise ValueError(f"{op}: {name} has {len(value)} tensors for {groups} weights")
    return torch.stack([v.reshape(-1) for v in value])


def _weight_view(call, w, op):
    """(descriptor, strides) of a weight view [E, K, N] or [K, N] of any strides."""
    w = call.cpu(w, "weight")
    d = call.desc(w, "weight", contiguous=False)
    strides = tuple(w.stride()) + ((0,) if w.dim() == 2 else ())
    return d, strides


# ---- packed weights: one per weight tensor, for as long as it lives ----------------------------

class _Pack:
    """A megamoe_gmm_weights handle for one weight (a tensor view, or a list of them)."""

    def __init__(self, handle, bases, version):
        self.handle, self.version = handle, version
        self.refs = [weakref.ref(b, self._gone) for b in bases]
        self.key = None

    def _gone(self, _ref):
        _PACKS.pop(self.key, None)
        self.close()

    def close(self):
        if self.handle:
            _c.lib.megamoe_gmm_weights_destroy(self.handle)
            self.handle = None


_PACKS = {}


def _pack_enabled():
    v = os.environ.get("MEGAMOE_GMM_PACK", "on")
    if v not in ("on", "off"):
        raise ValueError(f"MEGAMOE_GMM_PACK={v!r}; use on or off")
    return v == "on"


def _packed(a, weights):
    """The packed copy of these weight tensors (created on first use, re-packed when a tensor
    changed: torch's version counter), or None when packing is off or the type has none."""
    if not _pack_enabled() or weights[0].dtype not in (torch.bfloat16, torch.int8, torch.int32):
        return None
    bases = [w._base if w._base is not None else w for w in weights]
    key = tuple(id(b) for b in bases)  # one pack per weight tensor (the last view used)
    view = (tuple(w.data_ptr() for w in weights), tuple(weights[0].shape),
            tuple(weights[0].stride()), weights[0].dtype)
    version = sum(w._version for w in weights) & 0xFFFFFFFFFFFFFFFF
    p = _PACKS.get(key)
    if p is not None and all(r() is b for r, b in zip(p.refs, bases)) and p.handle and \
            p.view == view:
        if p.version != version:
            check(_c.lib.megamoe_gmm_weights_update(p.handle, ctypes.byref(a), version, None))
            p.version = version
        return p.handle
    handle = ctypes.c_void_p()
    check(_c.lib.megamoe_gmm_weights_create(ctypes.byref(a), version, ctypes.byref(handle)))
    p = _Pack(handle.value, bases, version)
    p.key, p.view = key, view
    old = _PACKS.pop(key, None)
    if old is not None:
        old.close()
    _PACKS[key] = p
    return p.handle


def packed_weight_bytes():
    """Bytes of the packed weight copies the companion operators keep (MEGAMOE_GMM_PACK)."""
    return sum(_c.lib.megamoe_gmm_weights_bytes(p.handle) for p in _PACKS.values() if p.handle)


def _gmm_call(op, x, weight, *, weight_list=None, bias=None, scale=None, per_token_scale=None,
              antiquant_scale=None, antiquant_offset=None, group_list=None, group_list_type=0,
              y_dtype, int4=False):
    """One megamoe_grouped_matmul: x [M, K] by weight [E, K, N] (or the weight_list tensors)."""
    if faking():  # a fake kernel: the output's shape and dtype only
        last = (weight_list[0] if weight_list is not None else weight).shape[-1]
        return x.new_empty((x.shape[0], last * (8 if int4 else 1)), dtype=y_dtype)
    call = _c.Call(op)
    a = _c.default("grouped_matmul")
    a.x = call.desc(x, "x")
    if weight_list is not None:
        first = weight_list[0]
        for w in weight_list:
            if w.shape != first.shape or w.stride() != first.stride() or w.dtype != first.dtype:
                raise ValueError(f"{op}: the weight list's tensors must share shape, strides and "
                                 "dtype")
            call.cpu(w, "weight")
            call.keep.append(w)
        ptrs = (_c._vp * len(weight_list))(*[w.data_ptr() for w in weight_list])
        call.keep.append(ptrs)
        a.weight_list = ptrs
        shape = (len(weight_list),) + tuple(first.shape)
        a.weight.dtype = _c.FROM_TORCH.get(first.dtype, 99)
        a.weight.ndim = 3
        for i, s in enumerate(shape):
            a.weight.shape[i] = s
        a.weight_stride[0], a.weight_stride[1], a.weight_stride[2] = 0, *first.stride()
        n_cols = first.shape[-1] * (8 if int4 else 1)
    else:
        a.weight, strides = _weight_view(call, weight, op)
        for i, s in enumerate(strides):
            a.weight_stride[i] = s
        n_cols = weight.shape[-1] * (8 if int4 else 1)
    a.weight_int4 = 1 if int4 else 0
    a.bias = call.desc(bias, "bias")
    a.scale = call.desc(scale, "scale")
    a.per_token_scale = call.desc(per_token_scale, "per_token_scale")
    a.antiquant_scale = call.desc(antiquant_scale, "antiquant_scale")
    a.antiquant_offset = call.desc(antiquant_offset, "antiquant_offset")
    if group_list is not None:
        a.group_list = call.desc(group_list, "group_list")
    a.group_list_type = group_list_type
    y = torch.empty((x.shape[0], n_cols), dtype=y_dtype)
    a.y = call.out(y, "y")
    a.threads = _c.threads()
    a.packed = _packed(a, list(weight_list) if weight_list is not None else [weight])
    call.run(_c.lib.megamoe_grouped_matmul, a)
    return y


def _out_dtype(op, x, scale, output_dtype):
    if output_dtype is not None:
        if not isinstance(output_dtype, (torch.dtype, int)) or isinstance(output_dtype, bool):
            raise TypeError(f"{op}: output_dtype must be a torch.dtype (or torch_npu's integer "
                            f"code), got {output_dtype!r}")
        return _dtype_arg(op, "output_dtype", output_dtype)
    if x.dtype in _c.FLOATS:
        return x.dtype
    if scale is None:
        return torch.int32
    return torch.bfloat16 if scale.dtype == torch.bfloat16 else torch.float16


_GMM = ("npu_grouped_matmul(Tensor[] x, Tensor[] weight, *, Tensor[]? bias=None, "
        "Tensor[]? scale=None, Tensor[]? offset=None, Tensor[]? antiquant_scale=None, "
        "Tensor[]? antiquant_offset=None, Tensor[]? per_token_scale=None, "
        "Tensor? group_list=None, Tensor[]? activation_input=None, "
        "Tensor[]? activation_quant_scale=None, Tensor[]? activation_quant_offset=None, "
        "int? split_item=0, int? group_type=None, int? group_list_type=0, int? act_type=0, "
        "int[]? tuning_config=None, int? output_dtype=None, int? x_dtype=None, "
        "int? weight_dtype=None, int? scale_dtype=None, int? per_token_scale_dtype=None) "
        "-> Tensor[]")


def _group_list_arg(v):
    """group_list: a tensor, or torch_npu's .List overload (cumulative ints) as an int64 tensor."""
    if isinstance(v, (list, tuple)):
        return torch.tensor([int(n) for n in v], dtype=torch.int64)
    return v


_GMM_NORMALIZE = dict({n: _tensor_list for n in (
    "x", "weight", "bias", "scale", "offset", "antiquant_scale", "antiquant_offset",
    "per_token_scale", "activation_input", "activation_quant_scale", "activation_quant_offset")},
    group_list=_group_list_arg, output_dtype=_DTYPE, x_dtype=_DTYPE, weight_dtype=_DTYPE,
    scale_dtype=_DTYPE, per_token_scale_dtype=_DTYPE)


@_register(_GMM, normalize=_GMM_NORMALIZE)
def npu_grouped_matmul(x, weight, *, bias=None, scale=None, offset=None, antiquant_scale=None,
                       antiquant_offset=None, per_token_scale=None, group_list=None,
                       activation_input=None, activation_quant_scale=None,
                       activation_quant_offset=None, split_item=0, group_type=None,
                       group_list_type=0, act_type=0, tuning_config=None, output_dtype=None,
                       x_dtype=None, weight_dtype=None, scale_dtype=None,
                       per_token_scale_dtype=None):
    """torch_npu.npu_grouped_matmul: returns a list of tensors (docs/ops.md)."""
    op = "npu_grouped_matmul"
    _check_none(op, offset=offset, activation_input=activation_input,
                activation_quant_scale=activation_quant_scale,
                activation_quant_offset=activation_quant_offset)
    for name, v in (("x_dtype", x_dtype), ("weight_dtype", weight_dtype),
                    ("scale_dtype", scale_dtype), ("per_token_scale_dtype", per_token_scale_dtype)):
        v = _dtype_arg(op, name, v)
        if v is not None and v not in (torch.int8, torch.bfloat16, torch.float16, torch.float32,
                                       torch.int32, torch.int64):
            raise ValueError(f"{op}: {name}={v!r}: the fp8/fp4/MX storage types are Ascend 950 "
                             "only; megamoe runs int8, int4 (packed int32) and float operands")
    split_item = 0 if split_item is None else split_item
    group_list_type = 0 if group_list_type is None else group_list_type
    act_type = 0 if act_type is None else act_type
    if act_type not in _ACT:
        raise ValueError(f"{op}: act_type {act_type}; use 0 (none), 1 relu, 2 gelu-tanh, 4 fast-gelu "
                         "or 5 silu")
    if split_item not in (0, 1, 2, 3):
        raise ValueError(f"{op}: split_item {split_item}; use 0..3")
    xs = list(x) if isinstance(x, (list, tuple)) else [x]
    ws = list(weight) if isinstance(weight, (list, tuple)) else [weight]
    if not xs or not ws:
        raise ValueError(f"{op}: x and weight must be non-empty lists of tensors")
    if group_type not in (None, -1, 0):
        raise ValueError(f"{op}: group_type {group_type}: only None/-1 (no grouping) and 0 (groups "
                         "along M) are supported (group_type 2 has no MoE caller)")
    concat = split_item in (2, 3)
    int4 = ws[0].dtype == torch.int32
    group_list = _group_list_arg(group_list)  # the .List overload: cumulative ints
    outs = []

    def finish(y, ptoken):
        fn = _ACT[act_type]
        if fn is not None:
            y = fn(y.float()).to(y.dtype)
        return y

    if group_type in (None, -1) or group_list is None and len(xs) == len(ws) and len(xs) > 1:
        # multi-multi-multi: y_i = x_i @ w_i (x_i 2-6-D, w_i [K, N_i])
        if len(xs) != len(ws):
            raise ValueError(f"{op}: without groups x and weight must have the same length")
        for i, (xi, wi) in enumerate(zip(xs, ws)):
            if wi.dim() != 2:
                raise ValueError(f"{op}: weight[{i}] must be [K, N] without group_type 0")
            lead = xi.shape[:-1]
            x2 = xi.reshape(-1, xi.shape[-1])
            yd = _out_dtype(op, xi, _one(op, "scale", scale, i), output_dtype)
            y = _gmm_call(op, x2, wi, bias=_one(op, "bias", bias, i),
                          scale=_one(op, "scale", scale, i),
                          per_token_scale=_one(op, "per_token_scale", per_token_scale, i),
                          antiquant_scale=_one(op, "antiquant_scale", antiquant_scale, i),
                          antiquant_offset=_one(op, "antiquant_offset", antiquant_offset, i),
                          y_dtype=yd, int4=int4)
            outs.append(finish(y, None).reshape(*lead, y.shape[-1]))
        if concat:
            return [torch.cat([o.reshape(-1, o.shape[-1]) for o in outs])]
        return outs

    # group_type 0: groups along M
    if len(xs) > 1:  # each x_i is group i
        counts = torch.tensor([xi.shape[0] for xi in xs], dtype=torch.int64)
        xcat = torch.cat([xi.reshape(-1, xi.shape[-1]) for xi in xs])
        res = npu_grouped_matmul([xcat], ws, bias=bias, scale=scale,
                                 antiquant_scale=antiquant_scale,
                                 antiquant_offset=antiquant_offset,
                                 per_token_scale=per_token_scale, group_list=counts,
                                 split_item=2, group_type=0, group_list_type=1,
                                 act_type=act_type, output_dtype=output_dtype)[0]
        return [res] if concat else list(torch.split(res, [xi.reshape(-1, xi.shape[-1]).shape[0]
                                                           for xi in xs]))
    x0 = xs[0]
    if x0.dim() != 2:
        raise ValueError(f"{op}: with group_type 0, x must be one [M, K] tensor")
    weight_list = None
    if len(ws) == 1:
        w = ws[0]
        groups = w.shape[0] if w.dim() == 3 else 1
    else:
        weight_list, groups, w = ws, len(ws), None
        for i, wi in enumerate(ws):
            if wi.dim() != 2:
                raise ValueError(f"{op}: weight list entries must be [K, N]; entry {i} has "
                                 f"{wi.dim()} dims")
    sc = _stack_param(op, "scale", scale, groups)
    yd = _out_dtype(op, x0, sc, output_dtype)
    y = _gmm_call(op, x0, w, weight_list=weight_list, bias=_stack_param(op, "bias", bias, groups),
                  scale=sc,
                  per_token_scale=_stack_param(op, "per_token_scale", per_token_scale, 1),
                  antiquant_scale=_stack_param(op, "antiquant_scale", antiquant_scale, groups),
                  antiquant_offset=_stack_param(op, "antiquant_offset", antiquant_offset, groups),
                  group_list=group_list, group_list_type=group_list_type, y_dtype=yd, int4=int4)
    y = finish(y, per_token_scale)
    if concat:
        return [y]
    if group_list is None:
        return [y]
    if faking():  # each group's rows are data: sizes only the group list decides
        return [y.new_empty((dynamic_size(max=y.shape[0]), y.shape[1])) for _ in range(groups)]
    counts = _group_counts(op, group_list, group_list_type, groups, x0.shape[0])
    parts = list(torch.split(y[:int(counts.sum())], counts.tolist()))
    return parts


# ---- SwiGLU family -------------------------------------------------------------------------------

def _swiglu_args(call, x, dim, interleaved, clipped, alpha, limit, bias, valid_rows):
    a = _c.default("swiglu")
    a.x = call.desc(x, "input")
    a.dim = dim
    a.interleaved = 1 if interleaved else 0
    a.clipped = 1 if clipped else 0
    a.alpha, a.limit, a.bias = float(alpha), float(limit), float(bias)
    a.valid_rows = valid_rows
    a.threads = _c.threads()
    return a


def _halved(x, dim):
    shape = list(x.shape)
    d = dim % x.dim()
    shape[d] //= 2
    return shape


def _swiglu_fwd(x, dim):
    call = _c.Call("npu_swiglu")
    a = _swiglu_args(call, x, dim, False, False, 1.0, 0.0, 0.0, -1)
    y = x.new_empty(_halved(x, dim))
    a.y = call.out(y, "output")
    call.run(_c.lib.megamoe_swiglu, a)
    return y


def _check_float(op, name, t):
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{op}: {name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype not in _c.FLOATS:
        raise TypeError(f"{op}: {name} must be float32, float16 or bfloat16, got {t.dtype}")
    if not 1 <= t.dim() <= 8:
        raise ValueError(f"{op}: {name} must have 1 to 8 dims, got {t.dim()}")


def _as4d(x, dim):
    """x viewed with at most 4 dims around dim (the C kernel's limit): [pre, cut, post]."""
    d = dim % x.dim()
    pre = 1
    for s in x.shape[:d]:
        pre *= s
    return x.reshape(pre, x.shape[d], -1), 1


def _check_halves(op, x, dim):
    if x.shape[dim] % 2:
        raise ValueError(f"{op}: size {x.shape[dim]} of dim {dim} is odd")


@_megamoe.define("npu_swiglu(Tensor input, int dim=-1) -> Tensor", fake=FAKE_BY_BODY)
def _swiglu_op(input, dim=-1):
    """The forward kernel: silu(first half) * second half along dim."""
    _check_float("npu_swiglu", "input", input)
    _check_halves("npu_swiglu", input, dim)
    x3, d3 = _as4d(input, dim)
    return _swiglu_fwd(x3, d3).reshape(_halved(input, dim))


@_megamoe.define("npu_swiglu_backward(Tensor grad_output, Tensor input, int dim=-1) -> Tensor",
                 fake=FAKE_BY_BODY)
def _swiglu_backward_op(grad_output, input, dim=-1):
    """d input of npu_swiglu (torch_npu's npu_swiglu_backward): input's shape and dtype."""
    op = "npu_swiglu_backward"
    _check_float(op, "input", input)
    _check_halves(op, input, dim)
    x3, d3 = _as4d(input, dim)
    call = _c.Call(op)
    a = _swiglu_args(call, x3, d3, False, False, 1.0, 0.0, 0.0, -1)
    dy = call.desc(grad_output.to(input.dtype).reshape(_halved(x3, d3)), "grad_output")
    dx = x3.new_empty(x3.shape)
    d = call.out(dx, "grad_input")
    call.run(_c.lib.megamoe_swiglu_backward, a, dy, d)
    return dx.reshape(input.shape)


def _swiglu_setup(ctx, inputs, output):
    ctx.save_for_backward(inputs[0])
    ctx.dim = inputs[1] if len(inputs) > 1 else -1


def _swiglu_grad(ctx, grad):
    (x,) = ctx.saved_tensors
    return torch.ops.megamoe.npu_swiglu_backward(grad, x, ctx.dim), None


class _SwigluFunction(torch.autograd.Function):
    """torch < 2.4: npu_swiglu's autograd (from 2.4 the operator itself is differentiable)."""

    @staticmethod
    def forward(ctx, x, dim):
        ctx.dim = dim
        ctx.save_for_backward(x)
        return _swiglu_op(x, dim)

    @staticmethod
    def backward(ctx, grad):
        return _swiglu_grad(ctx, grad)


_SWIGLU_AUTOGRAD = _megamoe.register_autograd("npu_swiglu", _swiglu_grad,
                                              setup_context=_swiglu_setup)


def npu_swiglu(input, dim=-1):
    """torch_npu.npu_swiglu: silu(first half) * second half along dim, differentiable
    (torch.ops.megamoe.npu_swiglu; its gradient is npu_swiglu_backward)."""
    if not _SWIGLU_AUTOGRAD and isinstance(input, torch.Tensor) and input.requires_grad \
            and torch.is_grad_enabled():
        return _SwigluFunction.apply(input, dim)
    return _swiglu_op(input, dim)


OPERATORS["npu_swiglu"] = npu_swiglu
npu_swiglu.operator = _swiglu_op  # the torch.ops entry (autograd wrapper above)


@_register("npu_clipped_swiglu(Tensor x, *, Tensor? group_index=None, int dim=-1, "
           "float alpha=1.702, float limit=7.0, float bias=1.0, bool interleaved=True) -> Tensor")
def npu_clipped_swiglu(x, *, group_index=None, dim=-1, alpha=1.702, limit=7.0, bias=1.0,
                       interleaved=True):
    """torch_npu.npu_clipped_swiglu (gpt-oss SwiGLU): rows past sum(group_index) are zero."""
    op = "npu_clipped_swiglu"
    _check_float(op, "x", x)
    _check_halves(op, x, dim)
    x3, d3 = _as4d(x, dim)
    valid = -1
    if group_index is not None and not faking():
        valid = int(group_index.to(torch.int64).sum())
        if valid < 0:
            raise ValueError(f"{op}: group_index sums to {valid}")
    call = _c.Call(op)
    a = _swiglu_args(call, x3, d3, interleaved, True, alpha, limit, bias, valid)
    y = x3.new_empty(_halved(x3, d3))
    a.y = call.out(y, "y")
    call.run(_c.lib.megamoe_swiglu, a)
    return y.reshape(_halved(x, dim))


# ---- quantisation ----------------------------------------------------------------------------------

_QUINT4X2 = getattr(torch, "quint4x2", None)


@_register("npu_dynamic_quant(Tensor x, *, Tensor? smooth_scales=None, Tensor? group_index=None, "
           "ScalarType? dst_type=None, str quant_mode=\"pertoken\", float dst_type_max=0.0) "
           "-> (Tensor, Tensor)")
def npu_dynamic_quant(x, *, smooth_scales=None, group_index=None, dst_type=None,
                      quant_mode="pertoken", dst_type_max=0.0):
    """torch_npu.npu_dynamic_quant: per-token symmetric int8 (or int4) -> (y, scale)."""
    op = "npu_dynamic_quant"
    _check_float(op, "x", x)
    if quant_mode != "pertoken":
        raise ValueError(f"{op}: quant_mode {quant_mode!r}; megamoe implements 'pertoken' (the "
                         "other modes are Ascend 950 storage formats)")
    if dst_type_max not in (0, 0.0):
        raise ValueError(f"{op}: dst_type_max applies to the Ascend 950 fp8/hif8 outputs only")
    if isinstance(dst_type, int) and not isinstance(dst_type, bool):
        dst_type = _dtype_arg(op, "dst_type", dst_type)
    int4 = dst_type is not None and dst_type == _QUINT4X2
    if dst_type not in (None, torch.int8) and not int4:
        raise ValueError(f"{op}: dst_type {dst_type!r}; use torch.int8 or torch.quint4x2")
    call = _c.Call(op)
    a = _c.default("dynamic_quant")
    x2 = x.reshape(-1, x.shape[-1])
    a.x = call.desc(x2, "x")
    a.smooth_scales = call.desc(smooth_scales, "smooth_scales")
    if group_index is not None:
        a.group_index = call.desc(group_index, "group_index")
    h = x.shape[-1]
    if int4:
        if h % 8:
            raise ValueError(f"{op}: int4 output needs the last dim divisible by 8, got {h}")
        y = x.new_empty((*x.shape[:-1], h // 8), dtype=torch.int32)
    else:
        y = x.new_empty(x.shape, dtype=torch.int8)
    scale = x.new_empty(x.shape[:-1], dtype=torch.float32)
    a.y = call.out(y.reshape(x2.shape[0], -1), "y")
    a.scale = call.out(scale.reshape(-1), "scale")
    a.threads = _c.threads()
    call.run(_c.lib.megamoe_dynamic_quant, a)
    return y, scale


_QUANT_MODES = {0: 0, 1: 1, "static": 0, "dynamic": 1}


def _dsq(op, x, *, weight_scale, activation_scale, bias, quant_scale, quant_offset, group_index,
         group_index_type, activate_left, quant_mode, swiglu_mode, clamp_limit, glu_alpha,
         glu_bias):
    if quant_mode not in _QUANT_MODES:
        raise ValueError(f"{op}: quant_mode {quant_mode!r}; use 1 / 'dynamic' or 0 / 'static'")
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{op}: x must be a torch.Tensor")
    if x.dim() < 2:
        raise ValueError(f"{op}: x must have at least 2 dims, got {x.dim()}")
    lead = x.shape[:-1]
    x2 = x.reshape(-1, x.shape[-1])
    call = _c.Call(op)
    a = _c.default("dequant_swiglu_quant")
    a.x = call.desc(x2, "x")
    a.weight_scale = call.desc(weight_scale, "weight_scale")
    a.activation_scale = call.desc(activation_scale, "activation_scale")
    a.bias = call.desc(bias, "bias")
    a.quant_scale = call.desc(quant_scale, "quant_scale")
    a.quant_offset = call.desc(quant_offset, "quant_offset")
    if group_index is not None:
        a.group_index = call.desc(group_index, "group_index")
    a.group_index_type = group_index_type
    a.activate_left = 1 if activate_left else 0
    a.quant_mode = _QUANT_MODES[quant_mode]
    a.swiglu_mode = swiglu_mode
    a.clamp_limit, a.glu_alpha, a.glu_bias = float(clamp_limit), float(glu_alpha), float(glu_bias)
    h = x.shape[-1] // 2
    y = x2.new_empty((x2.shape[0], h), dtype=torch.int8)
    scale = x2.new_empty(x2.shape[0], dtype=torch.float32)
    a.y = call.out(y, "y")
    a.scale = call.out(scale, "scale")
    a.threads = _c.threads()
    call.run(_c.lib.megamoe_dequant_swiglu_quant, a)
    return y.reshape(*lead, h), scale.reshape(lead)


def _quant_mode_arg(v):
    return {"static": 0, "dynamic": 1}.get(v, v) if isinstance(v, str) else v


def _round_mode_arg(v):
    return 0 if v == "rint" else v  # torch_npu's int code 0 = rint


@_register("npu_dequant_swiglu_quant(Tensor x, *, Tensor? weight_scale=None, "
           "Tensor? activation_scale=None, Tensor? bias=None, Tensor? quant_scale=None, "
           "Tensor? quant_offset=None, Tensor? group_index=None, bool activate_left=False, "
           "int quant_mode=0, int? dst_type=None, int? round_mode=None, int? activate_dim=None, "
           "int swiglu_mode=0, float clamp_limit=7.0, float glu_alpha=1.702, "
           "float glu_bias=1.0) -> (Tensor, Tensor)",
           normalize={"quant_mode": _quant_mode_arg, "dst_type": _DTYPE,
                      "round_mode": _round_mode_arg})
def npu_dequant_swiglu_quant(x, *, weight_scale=None, activation_scale=None, bias=None,
                             quant_scale=None, quant_offset=None, group_index=None,
                             activate_left=False, quant_mode=0, dst_type=None, round_mode=None,
                             activate_dim=None, swiglu_mode=0, clamp_limit=7.0, glu_alpha=1.702,
                             glu_bias=1.0):
    """torch_npu.npu_dequant_swiglu_quant -> (out int8 [..., H], scale fp32 [...])."""
    op = "npu_dequant_swiglu_quant"
    if dst_type not in (None, torch.int8, 1):
        raise ValueError(f"{op}: dst_type {dst_type!r}; megamoe writes int8 (the other types are "
                         "Ascend 950 only)")
    if round_mode not in (None, 0, "rint"):
        raise ValueError(f"{op}: round_mode {round_mode!r}; megamoe's int8 output rounds half "
                         "away from zero, what torch_npu calls 0 / 'rint' here (docs/ops.md)")
    if activate_dim not in (None, -1) and (not isinstance(x, torch.Tensor)
                                           or activate_dim != x.dim() - 1):
        raise ValueError(f"{op}: activate_dim {activate_dim}: only the last dim is supported")
    return _dsq(op, x, weight_scale=weight_scale, activation_scale=activation_scale, bias=bias,
                quant_scale=quant_scale, quant_offset=quant_offset, group_index=group_index,
                group_index_type=1, activate_left=activate_left, quant_mode=quant_mode,
                swiglu_mode=swiglu_mode, clamp_limit=clamp_limit, glu_alpha=glu_alpha,
                glu_bias=glu_bias)


# ---- npu_grouped_matmul_swiglu_quant (v1, v2) -------------------------------------------------------

def _gmm_swiglu_quant(op, x, weight, group_list, group_list_type, weight_scale, x_scale, bias,
                      smooth_scale, int4):
    """W8A8 (or A8W4) grouped matmul dequantised to fp32, SwiGLU (first half = gate), smoothing,
    per-row dynamic int8; rows past the group list's total are zero with scale 0."""
    if x.dtype != torch.int8:
        raise TypeError(f"{op}: x must be int8 (the dispatch's quantised tokens), got {x.dtype}")
    y = _gmm_call(op, x, weight, scale=weight_scale, per_token_scale=x_scale, bias=bias,
                  group_list=group_list, group_list_type=group_list_type, y_dtype=torch.float32,
                  int4=int4)
    groups = weight.shape[0] if weight.dim() == 3 else 1
    qs = None
    gi = None
    if smooth_scale is not None:
        qs = smooth_scale
        if qs.dim() == 1:  # [E]: one factor per group
            qs = qs.reshape(-1, 1).expand(-1, y.shape[1] // 2).contiguous()
        gi = group_list.new_empty(groups, dtype=torch.int64) if faking() else \
            _group_counts(op, group_list, group_list_type, groups, x.shape[0])
    out, scale = _dsq(op, y, weight_scale=None, activation_scale=None, bias=None, quant_scale=qs,
                      quant_offset=None, group_index=gi, group_index_type=1, activate_left=True,
                      quant_mode=1, swiglu_mode=0, clamp_limit=7.0, glu_alpha=1.702, glu_bias=1.0)
    if faking():
        return out, scale
    total = int(_group_counts(op, group_list, group_list_type, groups, x.shape[0]).sum())
    if gi is None and total < x.shape[0]:
        out[total:] = 0
        scale[total:] = 0
    return out, scale


@_register("npu_grouped_matmul_swiglu_quant(Tensor x, Tensor weight, Tensor group_list, "
           "Tensor weight_scale, Tensor x_scale, *, Tensor? bias=None, Tensor? offset=None) "
           "-> (Tensor, Tensor, Tensor)")
def npu_grouped_matmul_swiglu_quant(x, weight, group_list, weight_scale, x_scale, *, bias=None,
                                    offset=None):
    """torch_npu.npu_grouped_matmul_swiglu_quant (cumulative group_list) ->
    (out int8 [M, N/2], out_scale fp32 [M], out_offset fp32 0-D)."""
    op = "npu_grouped_matmul_swiglu_quant"
    _check_none(op, offset=offset)
    int4 = weight.dtype == torch.int32
    out, scale = _gmm_swiglu_quant(op, x, weight, group_list, 0, weight_scale, x_scale, bias,
                                   None, int4)
    return out, scale, x.new_zeros((), dtype=torch.float32)


@_register("npu_grouped_matmul_swiglu_quant_v2(Tensor x, Tensor[] weight, Tensor[] weight_scale, "
           "Tensor x_scale, Tensor group_list, *, Tensor? smooth_scale=None, "
           "Tensor[]? weight_assist_matrix=None, Tensor? bias=None, int? dequant_mode=0, "
           "int? dequant_dtype=0, int? quant_mode=0, int? quant_dtype=1, "
           "int? group_list_type=0, int[]? tuning_config=None, int? x_dtype=None, "
           "int? weight_dtype=None, int? weight_scale_dtype=None, int? x_scale_dtype=None) "
           "-> (Tensor, Tensor)",
           normalize={"weight": _tensor_list, "weight_scale": _tensor_list,
                      "weight_assist_matrix": _tensor_list, "x_dtype": _DTYPE,
                      "weight_dtype": _DTYPE, "weight_scale_dtype": _DTYPE,
                      "x_scale_dtype": _DTYPE})
def npu_grouped_matmul_swiglu_quant_v2(x, weight, weight_scale, x_scale, group_list, *,
                                       smooth_scale=None, weight_assist_matrix=None, bias=None,
                                       dequant_mode=0, dequant_dtype=0, quant_mode=0,
                                       quant_dtype=1, group_list_type=0, tuning_config=None,
                                       x_dtype=None, weight_dtype=None, weight_scale_dtype=None,
                                       x_scale_dtype=None):
    """torch_npu.npu_grouped_matmul_swiglu_quant_v2 (one-element weight / weight_scale lists)
    -> (out int8 [M, N/2], out_scale fp32 [M])."""
    op = "npu_grouped_matmul_swiglu_quant_v2"
    dequant_mode = 0 if dequant_mode is None else dequant_mode
    quant_mode = 0 if quant_mode is None else quant_mode
    quant_dtype = 1 if quant_dtype is None else quant_dtype
    group_list_type = 0 if group_list_type is None else group_list_type
    if dequant_mode not in (0, 1) or quant_mode != 0 or quant_dtype not in (0, 1):
        raise ValueError(f"{op}: dequant_mode {dequant_mode}, quant_mode {quant_mode}, quant_dtype "
                         f"{quant_dtype}: megamoe runs the int8 forms (dequant_mode 0/1, "
                         "quant_mode 0, int8 output); the MX / fp8 modes are Ascend 950 only")
    for name, v in (("x_dtype", x_dtype), ("weight_dtype", weight_dtype),
                    ("weight_scale_dtype", weight_scale_dtype), ("x_scale_dtype", x_scale_dtype)):
        v = _dtype_arg(op, name, v)
        if v is not None and v not in (torch.int8, torch.int32, torch.float32, torch.bfloat16,
                                       torch.int64):
            raise ValueError(f"{op}: {name}={v!r} is an Ascend 950 storage type")
    ws = list(weight) if isinstance(weight, (list, tuple)) else [weight]
    ss = list(weight_scale) if isinstance(weight_scale, (list, tuple)) else [weight_scale]
    if len(ws) != 1 or len(ss) != 1:
        raise ValueError(f"{op}: weight and weight_scale are one-element lists")
    int4 = ws[0].dtype == torch.int32
    b = bias
    if weight_assist_matrix is not None:  # A8W4: the assist matrix is the device's bias term
        wam = weight_assist_matrix[0] if isinstance(weight_assist_matrix, (list, tuple)) \
            else weight_assist_matrix
        b = wam if b is None else b + wam
    if isinstance(b, (list, tuple)):
        b = b[0] if b else None
    return _gmm_swiglu_quant(op, x, ws[0], group_list, group_list_type, ss[0], x_scale, b,
                             smooth_scale, int4)
