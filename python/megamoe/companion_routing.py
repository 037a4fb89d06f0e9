"""torch_npu's routing companions on megamoe's C kernels: ``npu_moe_init_routing_v2``,
``npu_moe_finalize_routing``, ``npu_moe_token_permute`` / ``npu_moe_token_unpermute`` (with
their gradients), ``npu_moe_gating_top_k``, ``npu_moe_update_expert`` — exact torch_npu
signatures, re-exported by :mod:`megamoe.ops`. Rules: docs/ops.md "Companion operators"."""
import torch

from . import _companion_c as _c
from . import _dtypes
from ._library import FAKE_BY_BODY, faking
from ._library import megamoe as _megamoe
from .companion import _DTYPE, OPERATORS, _register

__all__ = ["npu_moe_init_routing_v2", "npu_moe_finalize_routing", "npu_moe_token_permute",
           "npu_moe_token_unpermute", "npu_moe_gating_top_k", "npu_moe_update_expert"]

_OPERATORS = OPERATORS  # one registry for every companion operator


# ---- npu_moe_init_routing_v2 -------------------------------------------------------------------

def _alloc(desc, like):
    shape = tuple(desc.shape[i] for i in range(desc.ndim))
    dtype = {v: k for k, v in _c.FROM_TORCH.items()}[desc.dtype]
    return like.new_empty(shape, dtype=dtype)


@_register("npu_moe_init_routing_v2(Tensor x, Tensor expert_idx, *, Tensor? scale=None, "
           "Tensor? offset=None, int active_num=-1, int expert_capacity=-1, int expert_num=-1, "
           "int drop_pad_mode=0, int expert_tokens_num_type=0, bool expert_tokens_num_flag=False, "
           "int quant_mode=-1, int[2] active_expert_range=[], int row_idx_type=0, "
           "int? x_dtype=None) -> (Tensor, Tensor, Tensor, Tensor)",
           normalize={"x_dtype": _DTYPE})
def npu_moe_init_routing_v2(x, expert_idx, *, scale=None, offset=None, active_num=-1,
                            expert_capacity=-1, expert_num=-1, drop_pad_mode=0,
                            expert_tokens_num_type=0, expert_tokens_num_flag=False,
                            quant_mode=-1, active_expert_range=[], row_idx_type=0,
                            x_dtype=None):
    """-> (expanded_x, expanded_row_idx, expert_tokens, expanded_scale); docs/ops.md."""
    op = "npu_moe_init_routing_v2"
    if x_dtype is not None and not isinstance(x_dtype, torch.dtype):
        code = _dtypes.from_npu_code(x_dtype)
        x_dtype = None if code == _dtypes.INVALID else _dtypes.torch_dtype(code)
        if x_dtype is None:
            raise ValueError(f"{op}: x_dtype is not a dtype code megamoe knows")
    if x_dtype is not None and isinstance(x, torch.Tensor) and x_dtype != x.dtype:
        raise ValueError(f"{op}: x_dtype {x_dtype} does not match x ({x.dtype}); the MX / fp8 "
                         "input types are Ascend 950 only")
    rng = list(active_expert_range) if active_expert_range is not None else []
    if rng and len(rng) != 2:
        raise ValueError(f"{op}: active_expert_range must be [] or [start, end]")
    if rng and not rng[0] < rng[1]:
        raise ValueError(f"{op}: active_expert_range {rng} must be increasing")
    call = _c.Call(op)
    a = _c.default("init_routing")
    a.x = call.desc(x, "x")
    a.expert_idx = call.desc(expert_idx, "expert_idx")
    a.scale = call.desc(scale, "scale")
    a.offset = call.desc(offset, "offset")
    a.active_num, a.expert_capacity, a.expert_num = active_num, expert_capacity, expert_num
    a.drop_pad_mode, a.expert_tokens_num_type = drop_pad_mode, expert_tokens_num_type
    a.expert_tokens_num_flag = 1 if expert_tokens_num_flag else 0
    a.quant_mode, a.row_idx_type = quant_mode, row_idx_type
    if rng:
        a.range_start, a.range_end = int(rng[0]), int(rng[1])
    a.threads = _c.threads()
    from .errors import check
    check(_c.lib.megamoe_init_routing_infer(a))
    outs = [_alloc(a.expanded_x, x), _alloc(a.expanded_row_idx, x), _alloc(a.expert_tokens, x),
            _alloc(a.expanded_scale, x)]
    for name, t in zip(("expanded_x", "expanded_row_idx", "expert_tokens", "expanded_scale"), outs):
        setattr(a, name, call.out(t, name))
    call.run(_c.lib.megamoe_init_routing, a)
    return tuple(outs)


# ---- npu_moe_finalize_routing -------------------------------------------------------------------

@_megamoe.define("npu_moe_finalize_routing(Tensor expanded_permuted_rows, Tensor? skip1, "
                 "Tensor? skip2, Tensor? bias, Tensor? scales, Tensor expanded_src_to_dst_row, "
                 "Tensor? export_for_source_row=None, int? drop_pad_mode=0, int k=1) -> Tensor",
                 fake=FAKE_BY_BODY)
def _finalize_routing_op(expanded_permuted_rows, skip1, skip2, bias, scales,
                         expanded_src_to_dst_row, export_for_source_row=None, drop_pad_mode=0,
                         k=1):
    op = "npu_moe_finalize_routing"
    rows = expanded_permuted_rows
    if not isinstance(rows, torch.Tensor):
        raise TypeError(f"{op}: expanded_permuted_rows must be a torch.Tensor")
    kk = scales.shape[1] if scales is not None and scales.dim() == 2 else k
    n = expanded_src_to_dst_row.numel() // max(1, kk)
    if skip1 is not None:
        n = skip1.shape[0]
    call = _c.Call(op)
    a = _c.default("finalize_routing")
    a.expanded_permuted_rows = call.desc(rows, "expanded_permuted_rows")
    a.skip1 = call.desc(skip1, "skip1")
    a.skip2 = call.desc(skip2, "skip2")
    a.bias = call.desc(bias, "bias")
    a.scales = call.desc(scales, "scales")
    a.expanded_src_to_dst_row = call.desc(expanded_src_to_dst_row, "expanded_src_to_dst_row")
    a.expert_for_source_row = call.desc(export_for_source_row, "export_for_source_row")
    a.drop_pad_mode, a.k = int(drop_pad_mode if drop_pad_mode is not None else 0), int(k)
    out = rows.new_empty((n, rows.shape[-1]))
    a.out = call.out(out, "out")
    a.threads = _c.threads()
    call.run(_c.lib.megamoe_finalize_routing, a)
    return out


def npu_moe_finalize_routing(expanded_permuted_rows, skip1, skip2, bias, scales,
                             expanded_src_to_dst_row, export_for_source_row=None, drop_pad_mode=0,
                             k=1, **alias):
    """out[n] = skip1 + skip2 + sum_k scales[n, k] * (rows[idx(n, k)] + bias[expert(n, k)])
    (torch.ops.megamoe.npu_moe_finalize_routing). ``expert_for_source_row=`` (the docs'
    spelling) is accepted for export_for_source_row."""
    op = "npu_moe_finalize_routing"
    if alias:
        unknown = set(alias) - {"expert_for_source_row"}
        if unknown:
            raise TypeError(f"{op}() got an unexpected keyword argument {sorted(unknown)[0]!r}")
        if export_for_source_row is not None:
            raise TypeError(f"{op}: pass export_for_source_row or expert_for_source_row, not both")
        export_for_source_row = alias["expert_for_source_row"]
    return _finalize_routing_op(expanded_permuted_rows, skip1, skip2, bias, scales,
                                expanded_src_to_dst_row, export_for_source_row,
                                drop_pad_mode, k)


OPERATORS["npu_moe_finalize_routing"] = npu_moe_finalize_routing
npu_moe_finalize_routing.operator = _finalize_routing_op


# ---- npu_moe_token_permute / unpermute ------------------------------------------------------------

def _width(t):
    w = 1
    for d in t.shape[1:]:
        w *= d
    return w


def _unpermute(rows, index, probs, t_rows, width, like):
    call = _c.Call("npu_moe_token_unpermute")
    out = like.new_empty((t_rows, width))
    r = call.desc(rows.reshape(rows.shape[0], -1) if rows.dim() != 2 else rows, "permuted_tokens")
    i = call.desc(index.reshape(-1), "sorted_indices")
    p = call.desc(probs, "probs")
    o = call.out(out, "out")
    call.run(_c.lib.megamoe_token_unpermute, r, i, p, o, _c.threads())
    return out


@_megamoe.define("npu_moe_token_permute(Tensor tokens, Tensor indices, int? num_out_tokens=None, "
                 "bool padded_mode=False) -> (Tensor, Tensor)", fake=FAKE_BY_BODY)
def _token_permute_op(tokens, indices, num_out_tokens=None, padded_mode=False):
    """-> (permuted_tokens, sorted_indices int32 [T*K]): rows sorted (stably) by expert id;
    sorted_indices[i] = the destination row of flat pair i."""
    op = "npu_moe_token_permute"
    if padded_mode:
        raise ValueError(f"{op}: padded_mode=True is not supported (torch_npu: 'not supported yet')")
    if not isinstance(tokens, torch.Tensor) or not isinstance(indices, torch.Tensor):
        raise TypeError(f"{op}: tokens and indices must be tensors")
    if tokens.dim() < 2:
        raise ValueError(f"{op}: tokens must have at least 2 dims")
    if indices.dtype not in (torch.int32, torch.int64):
        raise TypeError(f"{op}: indices must be int32 or int64, got {indices.dtype}")
    n = int(num_out_tokens or 0)
    nk = indices.numel()
    r = n if n > 0 else n + nk
    r = min(r, nk) if n > 0 else max(r, 0)
    call = _c.Call(op)
    permuted = tokens.new_empty((r, *tokens.shape[1:]))
    sorted_indices = tokens.new_empty(nk, dtype=torch.int32)
    t = call.desc(tokens.reshape(tokens.shape[0], -1), "tokens")
    i = call.desc(indices, "indices")
    p = call.out(permuted.reshape(r, -1), "permuted_tokens")
    o = call.out(sorted_indices, "sorted_indices")
    call.run(_c.lib.megamoe_token_permute, t, i, n, p, o, _c.threads())
    return permuted, sorted_indices


@_megamoe.define("moe_token_permute_backward(Tensor grad_permuted_tokens, Tensor sorted_indices, "
                 "int num_tokens) -> Tensor", fake=FAKE_BY_BODY)
def _token_permute_backward_op(grad_permuted_tokens, sorted_indices, num_tokens):
    """d tokens of npu_moe_token_permute: d tokens[t] = sum_k d permuted[sorted_indices[t*K + k]]
    (pairs dropped by num_out_tokens give 0)."""
    g = grad_permuted_tokens
    out = _unpermute(g.reshape(g.shape[0], _width(g)), sorted_indices, None, num_tokens, _width(g), g)
    return out.reshape((num_tokens, *g.shape[1:]))


def _permute_setup(ctx, inputs, output):
    ctx.save_for_backward(output[1])
    ctx.num_tokens = inputs[0].shape[0]


def _permute_grad(ctx, grad, _grad_indices):
    (sorted_indices,) = ctx.saved_tensors
    g = torch.ops.megamoe.moe_token_permute_backward(grad.contiguous(), sorted_indices,
                                                     ctx.num_tokens)
    return g, None, None, None


class _PermuteFunction(torch.autograd.Function):
    """torch < 2.4: npu_moe_token_permute's autograd (the operator's own from 2.4)."""

    @staticmethod
    def forward(ctx, tokens, indices, num_out_tokens, padded_mode):
        permuted, sorted_indices = _token_permute_op(tokens, indices, num_out_tokens, padded_mode)
        _permute_setup(ctx, (tokens,), (permuted, sorted_indices))
        ctx.mark_non_differentiable(sorted_indices)
        return permuted, sorted_indices

    @staticmethod
    def backward(ctx, grad, grad_indices):
        return _permute_grad(ctx, grad, grad_indices)


_PERMUTE_AUTOGRAD = _megamoe.register_autograd("npu_moe_token_permute", _permute_grad,
                                               setup_context=_permute_setup)


def _wants_grad(*ts):
    return torch.is_grad_enabled() and any(isinstance(t, torch.Tensor) and t.requires_grad
                                           for t in ts)


def npu_moe_token_permute(tokens, indices, num_out_tokens=None, padded_mode=False):
    """-> (permuted_tokens, sorted_indices int32 [T*K]): rows sorted (stably) by expert id;
    sorted_indices[i] = the destination row of flat pair i. Differentiable in tokens
    (torch.ops.megamoe.npu_moe_token_permute)."""
    if not _PERMUTE_AUTOGRAD and _wants_grad(tokens):
        return _PermuteFunction.apply(tokens, indices, num_out_tokens, padded_mode)
    return _token_permute_op(tokens, indices, num_out_tokens, padded_mode)


@_megamoe.define("npu_moe_token_unpermute(Tensor permuted_tokens, Tensor sorted_indices, "
                 "Tensor? probs=None, bool padded_mode=False, int[]? restore_shape=None) "
                 "-> Tensor", fake=FAKE_BY_BODY)
def _token_unpermute_op(permuted_tokens, sorted_indices, probs=None, padded_mode=False,
                        restore_shape=None):
    op = "npu_moe_token_unpermute"
    if padded_mode:
        raise ValueError(f"{op}: padded_mode=True is not supported (torch_npu: 'not supported yet')")
    if not isinstance(permuted_tokens, torch.Tensor) or not isinstance(sorted_indices, torch.Tensor):
        raise TypeError(f"{op}: permuted_tokens and sorted_indices must be tensors")
    nk = sorted_indices.numel()
    if probs is not None:
        if probs.dim() != 2 or probs.numel() != nk:
            raise ValueError(f"{op}: probs must be [T, K] with T*K = {nk} (sorted_indices' length)")
        t_rows = probs.shape[0]
    else:
        t_rows = nk
    p = permuted_tokens
    out = _unpermute(p.reshape(p.shape[0], -1), sorted_indices, probs, t_rows, _width(p), p)
    return out.reshape((t_rows, *p.shape[1:]))


@_megamoe.define("moe_token_unpermute_backward(Tensor permuted_tokens, Tensor sorted_indices, "
                 "Tensor? probs, Tensor grad_output) -> (Tensor, Tensor)", fake=FAKE_BY_BODY)
def _token_unpermute_backward_op(permuted_tokens, sorted_indices, probs, grad_output):
    """(d permuted_tokens, d probs) of npu_moe_token_unpermute (d probs is empty without
    probs)."""
    call = _c.Call("npu_moe_token_unpermute_backward")
    rows = permuted_tokens.reshape(permuted_tokens.shape[0], -1)
    d_rows = rows.new_empty(rows.shape)
    d_probs = probs.new_empty(probs.shape) if probs is not None else rows.new_empty(0)
    args = [call.desc(rows, "permuted_tokens"), call.desc(sorted_indices.reshape(-1), "index"),
            call.desc(probs, "probs"),
            call.desc(grad_output.reshape(grad_output.shape[0], -1).to(permuted_tokens.dtype),
                      "grad_output"),
            call.out(d_rows, "d_permuted"),
            call.out(d_probs, "d_probs") if probs is not None else _c.Tensor()]
    call.run(_c.lib.megamoe_token_unpermute_backward, *args, _c.threads())
    return d_rows.reshape(permuted_tokens.shape), d_probs


def _unpermute_setup(ctx, inputs, output):
    permuted, sorted_indices = inputs[0], inputs[1]
    probs = inputs[2] if len(inputs) > 2 else None
    ctx.save_for_backward(permuted, sorted_indices, probs)


def _unpermute_grad(ctx, grad):
    permuted, sorted_indices, probs = ctx.saved_tensors
    d_rows, d_probs = torch.ops.megamoe.moe_token_unpermute_backward(
        permuted, sorted_indices, probs, grad.contiguous())
    return d_rows, None, (d_probs if probs is not None else None), None, None


class _UnpermuteFunction(torch.autograd.Function):
    """torch < 2.4: npu_moe_token_unpermute's autograd (the operator's own from 2.4)."""

    @staticmethod
    def forward(ctx, permuted, sorted_indices, probs, padded_mode, restore_shape):
        _unpermute_setup(ctx, (permuted, sorted_indices, probs), None)
        return _token_unpermute_op(permuted, sorted_indices, probs, padded_mode, restore_shape)

    @staticmethod
    def backward(ctx, grad):
        return _unpermute_grad(ctx, grad)


_UNPERMUTE_AUTOGRAD = _megamoe.register_autograd("npu_moe_token_unpermute", _unpermute_grad,
                                                 setup_context=_unpermute_setup)


def npu_moe_token_unpermute(permuted_tokens, sorted_indices, probs=None, padded_mode=False,
                            restore_shape=None):
    """out[t] = sum_k probs[t, k] * permuted_tokens[sorted_indices[t*K + k]] (K = 1 without
    probs), fp32 accumulation, permuted_tokens' dtype. Duplicate indices work (plain gather);
    indices past the rows contribute zero. Differentiable in permuted_tokens and probs
    (torch.ops.megamoe.npu_moe_token_unpermute)."""
    if not _UNPERMUTE_AUTOGRAD and _wants_grad(permuted_tokens, probs):
        return _UnpermuteFunction.apply(permuted_tokens, sorted_indices, probs, padded_mode,
                                        restore_shape)
    return _token_unpermute_op(permuted_tokens, sorted_indices, probs, padded_mode, restore_shape)


for _f, _o in ((npu_moe_token_permute, _token_permute_op),
               (npu_moe_token_unpermute, _token_unpermute_op)):
    OPERATORS[_o.name] = _f
    _f.operator = _o


# ---- npu_moe_gating_top_k ------------------------------------------------------------------------

@_register("npu_moe_gating_top_k(Tensor x, int k, *, Tensor? bias=None, Tensor? input_ids=None, "
           "Tensor? tid2eid=None, int k_group=1, int group_count=1, int group_select_mode=0, "
           "int renorm=0, int norm_type=0, bool out_flag=False, "
           "float routed_scaling_factor=1.0, float eps=1e-20) -> (Tensor, Tensor, Tensor)")
def npu_moe_gating_top_k(x, k, *, bias=None, input_ids=None, tid2eid=None, k_group=1,
                         group_count=1, group_select_mode=0, renorm=0, norm_type=0,
                         out_flag=False, routed_scaling_factor=1.0, eps=1e-20):
    """-> (y [N, k] x's dtype, expert_idx int32 [N, k], norm_out fp32 [N, E]); docs/ops.md.
    With input_ids and tid2eid (hash routing) the experts are tid2eid[input_ids] and y their
    normalised scores."""
    op = "npu_moe_gating_top_k"
    if not isinstance(x, torch.Tensor) or x.dim() != 2:
        raise ValueError(f"{op}: x must be a 2-D [N, E] tensor")
    if (input_ids is None) != (tid2eid is None):
        raise ValueError(f"{op}: hash routing needs both input_ids and tid2eid")
    n, e = x.shape
    call = _c.Call(op)
    a = _c.default("gating_top_k")
    a.x = call.desc(x, "x")
    a.bias = call.desc(bias, "bias")
    a.k, a.k_group, a.group_count = int(k), int(k_group), int(group_count)
    a.group_select_mode, a.renorm, a.norm_type = int(group_select_mode), int(renorm), int(norm_type)
    a.routed_scaling_factor, a.eps = float(routed_scaling_factor), float(eps)
    y = x.new_empty((n, int(k)))
    idx = x.new_empty((n, int(k)), dtype=torch.int32)
    norm = x.new_empty((n, e), dtype=torch.float32)
    a.y, a.expert_idx, a.norm_out = call.out(y, "y"), call.out(idx, "expert_idx"), call.out(norm, "norm_out")
    a.threads = _c.threads()
    call.run(_c.lib.megamoe_gating_top_k, a)
    if input_ids is not None and not faking():  # hash routing: the table picks the experts
        table = tid2eid.to(torch.int64)
        ids = table[input_ids.reshape(-1).to(torch.int64)][:, :int(k)]
        if ids.shape != (n, int(k)) or bool(((ids < 0) | (ids >= e)).any()):
            raise ValueError(f"{op}: tid2eid[input_ids] must give [N, k] expert ids in [0, {e})")
        sel = norm.gather(1, ids)
        if norm_type == 1 or renorm == 1:
            sel = sel / (sel.sum(1, keepdim=True) + eps)
        y = (sel * routed_scaling_factor).to(x.dtype)
        idx = ids.to(torch.int32)
    return y, idx, norm


# ---- npu_moe_update_expert -------------------------------------------------------------------------

@_register("npu_moe_update_expert(Tensor expert_ids, Tensor eplb_table, *, "
           "Tensor? expert_scales=None, Tensor? pruning_threshold=None, Tensor? active_mask=None, "
           "int local_rank_id=-1, int world_size=-1, int balance_mode=0) -> (Tensor, Tensor)")
def npu_moe_update_expert(expert_ids, eplb_table, *, expert_scales=None, pruning_threshold=None,
                          active_mask=None, local_rank_id=-1, world_size=-1, balance_mode=0):
    """EPLB: logical expert ids -> physical replicas (-> (balanced_expert_ids, balanced_mask)).
    balance_mode 0 picks replica column local_rank_id // ceil(world_size / c) + 1, mode 1
    column (token % c) + 1 of eplb_table [log_E, F] (column 0 = c, the replica count). With
    expert_scales and pruning_threshold, pair (t, k) stays active iff expert_scales[t, k] >=
    threshold[k] * sum_k expert_scales[t, :] (and active_mask[t])."""
    op = "npu_moe_update_expert"
    if not isinstance(expert_ids, torch.Tensor) or expert_ids.dim() != 2:
        raise ValueError(f"{op}: expert_ids must be [BS, K]")
    if eplb_table.dim() != 2:
        raise ValueError(f"{op}: eplb_table must be [log_E, F]")
    bs, k = expert_ids.shape
    if faking():
        return expert_ids.new_empty((bs, k)), expert_ids.new_empty((bs, k), dtype=torch.bool)
    table = eplb_table.to(torch.int64)
    ids = expert_ids.to(torch.int64)
    if bool(((ids < 0) | (ids >= table.shape[0])).any()):
        raise ValueError(f"{op}: expert ids must be rows of eplb_table [0, {table.shape[0]})")
    count = table[ids, 0]
    if bool((count < 1).any()) or bool((count >= table.shape[1]).any()):
        raise ValueError(f"{op}: eplb_table column 0 (replica count) must be in [1, F)")
    if balance_mode == 0:
        if world_size <= 0 or not 0 <= local_rank_id < world_size:
            raise ValueError(f"{op}: balance_mode 0 needs 0 <= local_rank_id < world_size")
        per = (world_size + count - 1) // count  # ceil(world_size / c)
        col = local_rank_id // per + 1
    elif balance_mode == 1:
        tok = torch.arange(bs, dtype=torch.int64).unsqueeze(1).expand(bs, k)
        col = tok % count + 1
    else:
        raise ValueError(f"{op}: balance_mode {balance_mode}; use 0 (by rank) or 1 (by token)")
    col = torch.minimum(col, count)
    balanced = table[ids, col].to(expert_ids.dtype)
    mask = torch.ones((bs, k), dtype=torch.bool)
    if expert_scales is not None and pruning_threshold is not None:
        sc = expert_scales.float()
        thr = pruning_threshold.float().reshape(1, k)
        mask = sc >= thr * sc.sum(1, keepdim=True)
    if active_mask is not None:
        mask = mask & active_mask.to(torch.bool).reshape(bs, 1)
    return balanced, mask
