"""The companion operators one by one against the float64 models of companion_ref.py, on their
edge cases: every group-list type, empty groups, rows past the total, transposed and other
strided weight views, weight lists, int8 saturation and ties, masked / dropped rows, the
gradients. Single process, no communication (the caller blocks on 2 and 4 ranks are
test_companion_blocks.py)."""
import inspect

import pytest
import torch

import megamoe.ops as ops
from companion_ref import (F64, clipped_glu, close, counts_of, gmm, quant_rows, rel_l2, silu,
                           stable_order, swiglu)

torch.manual_seed(0)
BF = torch.bfloat16


def _sig(fn):
    return str(inspect.signature(fn))[1:-1]


# torch_npu's signatures (op-plugin op_plugin_functions.yaml, docs; spec companion_ops_spec.md)
SIGNATURES = {
    "npu_grouped_matmul": (
        "x, weight, *, bias=None, scale=None, offset=None, antiquant_scale=None, "
        "antiquant_offset=None, per_token_scale=None, group_list=None, activation_input=None, "
        "activation_quant_scale=None, activation_quant_offset=None, split_item=0, "
        "group_type=None, group_list_type=0, act_type=0, tuning_config=None, output_dtype=None, "
        "x_dtype=None, weight_dtype=None, scale_dtype=None, per_token_scale_dtype=None"),
    "npu_swiglu": "input, dim=-1",
    "npu_clipped_swiglu": ("x, *, group_index=None, dim=-1, alpha=1.702, limit=7.0, bias=1.0, "
                           "interleaved=True"),
    "npu_dynamic_quant": ("x, *, smooth_scales=None, group_index=None, dst_type=None, "
                          "quant_mode='pertoken', dst_type_max=0.0"),
    "npu_dequant_swiglu_quant": (
        "x, *, weight_scale=None, activation_scale=None, bias=None, quant_scale=None, "
        "quant_offset=None, group_index=None, activate_left=False, quant_mode=0, dst_type=None, "
        "round_mode=None, activate_dim=None, swiglu_mode=0, clamp_limit=7.0, glu_alpha=1.702, "
        "glu_bias=1.0"),
    "npu_grouped_matmul_swiglu_quant": ("x, weight, group_list, weight_scale, x_scale, *, "
                                        "bias=None, offset=None"),
    "npu_grouped_matmul_swiglu_quant_v2": (
        "x, weight, weight_scale, x_scale, group_list, *, smooth_scale=None, "
        "weight_assist_matrix=None, bias=None, dequant_mode=0, dequant_dtype=0, quant_mode=0, "
        "quant_dtype=1, group_list_type=0, tuning_config=None, x_dtype=None, weight_dtype=None, "
        "weight_scale_dtype=None, x_scale_dtype=None"),
    "npu_moe_init_routing_v2": (
        "x, expert_idx, *, scale=None, offset=None, active_num=-1, expert_capacity=-1, "
        "expert_num=-1, drop_pad_mode=0, expert_tokens_num_type=0, expert_tokens_num_flag=False, "
        "quant_mode=-1, active_expert_range=[], row_idx_type=0, x_dtype=None"),
    "npu_moe_finalize_routing": (
        "expanded_permuted_rows, skip1, skip2, bias, scales, expanded_src_to_dst_row, "
        "export_for_source_row=None, drop_pad_mode=0, k=1, **alias"),
    "npu_moe_token_permute": "tokens, indices, num_out_tokens=None, padded_mode=False",
    "npu_moe_token_unpermute": ("permuted_tokens, sorted_indices, probs=None, padded_mode=False, "
                                "restore_shape=None"),
    "npu_moe_gating_top_k": (
        "x, k, *, bias=None, input_ids=None, tid2eid=None, k_group=1, group_count=1, "
        "group_select_mode=0, renorm=0, norm_type=0, out_flag=False, routed_scaling_factor=1.0, "
        "eps=1e-20"),
    "npu_moe_update_expert": (
        "expert_ids, eplb_table, *, expert_scales=None, pruning_threshold=None, "
        "active_mask=None, local_rank_id=-1, world_size=-1, balance_mode=0"),
}


def test_signatures_and_registry():
    for name, sig in SIGNATURES.items():
        assert _sig(getattr(ops, name)) == sig, name
    assert set(SIGNATURES) == set(ops._companion.OPERATORS)


# ---- npu_grouped_matmul ---------------------------------------------------------------------------

@pytest.mark.parametrize("glt", [0, 1, 2])
def test_gmm_bf16_group_list_types_empty_groups_and_tail(glt):
    e, k, n, m = 5, 64, 48, 23
    counts = [4, 0, 9, 0, 6]  # 19 of 23 rows: the last 4 are past the total
    x = torch.randn(m, k).to(BF)
    w = torch.randn(e, k, n).to(BF)
    if glt == 0:
        gl = torch.tensor(counts).cumsum(0)
    elif glt == 1:
        gl = torch.tensor(counts)
    else:
        gl = torch.tensor([[g, c] for g, c in enumerate(counts) if c] + [[0, 0]] * 2)
    y = ops.npu_grouped_matmul([x], [w], group_list=gl, split_item=2, group_type=0,
                               group_list_type=glt)
    assert isinstance(y, list) and len(y) == 1 and y[0].dtype == BF
    close(y[0], gmm(x, w, counts), f"glt {glt}")
    assert bool((y[0][19:] == 0).all())


def test_gmm_transposed_and_strided_weight_views_and_weight_list():
    e, k, n, m = 3, 40, 56, 17
    counts = [5, 7, 5]
    x = torch.randn(m, k).to(BF)
    w_nk = torch.randn(e, n, k).to(BF)  # vLLM's w13 [E, 2I, H] passed as w13.transpose(1, 2)
    wt = w_nk.transpose(1, 2)
    ref = gmm(x, wt, counts)
    gl = torch.tensor(counts).cumsum(0)
    close(ops.npu_grouped_matmul([x], [wt], group_list=gl, split_item=2, group_type=0)[0], ref,
          "transposed view")
    # a view with neither stride 1 (every other column of a wider tensor)
    wide = torch.randn(e, k, 2 * n).to(BF)
    ws = wide[:, :, ::2]
    close(ops.npu_grouped_matmul([x], [ws], group_list=gl, split_item=3, group_type=0)[0],
          gmm(x, ws, counts), "strided view")
    # vLLM dynamic_eplb: a list of E [K, N] weights with per-expert bias
    wl = [wt[i] for i in range(e)]
    bias = [torch.randn(n) for _ in range(e)]
    y = ops.npu_grouped_matmul([x], wl, bias=bias, group_list=gl, split_item=2, group_type=0)[0]
    close(y, gmm(x, wt, counts, torch.stack(bias)), "weight list + bias")


def test_gmm_fp32_out_bias_fp16_fp32_and_outputs_per_group():
    e, k, n, m = 2, 33, 20, 9
    counts = [4, 5]
    gl = torch.tensor(counts)
    for dt in (BF, torch.float16, torch.float32):
        x = torch.randn(m, k).to(dt)
        w = torch.randn(e, k, n).to(dt)
        b = torch.randn(e, n)
        ys = ops.npu_grouped_matmul([x], [w], bias=[b], group_list=gl, split_item=0,
                                    group_type=0, group_list_type=1)
        assert [t.shape[0] for t in ys] == counts and ys[0].dtype == dt
        ref = gmm(x, w, counts, b)
        close(torch.cat(ys), ref, str(dt))
    x = torch.randn(m, k).to(BF)
    w = torch.randn(e, k, n).to(BF)
    y = ops.npu_grouped_matmul([x], [w], group_list=gl, split_item=2, group_type=0,
                               group_list_type=1, output_dtype=torch.float32)[0]
    assert y.dtype == torch.float32
    assert rel_l2(y, gmm(x, w, counts)) < 1e-5


def test_gmm_multi_multi_and_list_overload():
    xs = [torch.randn(2, 3, 16).to(BF), torch.randn(5, 24).to(BF)]
    ws = [torch.randn(16, 8).to(BF), torch.randn(24, 12).to(BF)]
    ys = ops.npu_grouped_matmul(xs, ws)
    assert ys[0].shape == (2, 3, 8) and ys[1].shape == (5, 12)
    close(ys[0], xs[0].double() @ ws[0].double(), "multi 0")
    close(ys[1], xs[1].double() @ ws[1].double(), "multi 1")
    x = torch.randn(10, 16).to(BF)
    w = torch.randn(2, 16, 8).to(BF)
    y = ops.npu_grouped_matmul([x], [w], group_list=[3, 10], split_item=2, group_type=0)[0]
    close(y, gmm(x, w, [3, 7]), "List[int] group_list")


def test_gmm_errors():
    x = torch.randn(8, 16).to(BF)
    w = torch.randn(2, 16, 8).to(BF)
    with pytest.raises(ValueError, match="covers 9 rows"):
        ops.npu_grouped_matmul([x], [w], group_list=torch.tensor([4, 9]), group_type=0,
                               split_item=2)
    with pytest.raises(ValueError, match="decreases"):
        ops.npu_grouped_matmul([x], [w], group_list=torch.tensor([5, 3]), group_type=0,
                               split_item=2)
    with pytest.raises(ValueError, match="reserved"):
        ops.npu_grouped_matmul([x], [w], offset=[torch.zeros(1)], group_type=0,
                               group_list=torch.tensor([8]), split_item=2)
    with pytest.raises(ValueError, match="K is 16|weight's K"):
        ops.npu_grouped_matmul([torch.randn(8, 12).to(BF)], [w], group_type=0,
                               group_list=torch.tensor([8]), split_item=2)


# ---- SwiGLU ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("dt", [BF, torch.float16, torch.float32])
@pytest.mark.parametrize("dim", [-1, 0, 1])
def test_swiglu_forward_backward(dt, dim):
    x = torch.randn(6, 8, 10).to(dt).requires_grad_()
    y = ops.npu_swiglu(x, dim=dim)
    ref = swiglu(x.detach(), dim)
    assert y.dtype == dt and y.shape == ref.shape
    close(y, ref, f"fwd {dt} {dim}")
    g = torch.randn_like(y)
    y.backward(g)
    xr = x.detach().double().requires_grad_()
    swiglu(xr, dim).backward(g.double())
    close(x.grad, xr.grad, f"bwd {dt} {dim}")


def test_swiglu_through_autograd_graph():
    x = torch.randn(4, 16, requires_grad=True)
    w = torch.randn(8, 5, requires_grad=True)
    ops.npu_swiglu(x).matmul(w).sum().backward()
    xr, wr = x.detach().clone().requires_grad_(), w.detach().clone().requires_grad_()
    swiglu(xr).float().matmul(wr).sum().backward()
    assert torch.allclose(x.grad, xr.grad, rtol=1e-4, atol=1e-5)
    assert torch.allclose(w.grad, wr.grad, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("interleaved", [True, False])
def test_clipped_swiglu(interleaved):
    x = (torch.randn(12, 32) * 6).to(BF)
    gi = torch.tensor([3, 0, 4])  # 7 of 12 rows; the rest zero
    y = ops.npu_clipped_swiglu(x, group_index=gi, alpha=1.5, limit=5.0, bias=0.5,
                               interleaved=interleaved)
    xd = x.double()
    a, b = (xd[:, 0::2], xd[:, 1::2]) if interleaved else xd.chunk(2, -1)
    ref = clipped_glu(a, b, 1.5, 5.0, 0.5)
    ref[7:] = 0
    close(y, ref, "clipped")
    assert bool((y[7:] == 0).all())


# ---- quantisation ---------------------------------------------------------------------------------

def test_dynamic_quant_rule_ties_saturation_zero_rows():
    # row 0: max 127 -> s = 1, q = v rounded half away from zero: 2.5 -> 3, -3.5 -> -4,
    # 0.5 -> 1, -0.5 -> -1 (the spec leaves ties open: the rule of megamoe's quantiser)
    x = torch.zeros(3, 8, dtype=torch.float32)
    x[0] = torch.tensor([127.0, 2.5, -3.5, 0.5, 1.5, -127.0, -0.5, 0.0])
    x[1] = 0.0  # zero row: scale 0, q 0
    x[2] = torch.randn(8)
    y, s = ops.npu_dynamic_quant(x.to(BF))
    assert y.dtype == torch.int8 and s.dtype == torch.float32 and s.shape == (3,)
    assert y[0].tolist() == [127, 3, -4, 1, 2, -127, -1, 0]
    assert s[0] == 1.0 and s[1] == 0 and bool((y[1] == 0).all())
    q, sr = quant_rows(x.to(BF).float())
    assert torch.equal(y, q) and torch.equal(s, sr)


def test_dynamic_quant_smooth_group_index_and_int4():
    x = torch.randn(2, 5, 16).to(BF)
    sm = torch.rand(16) + 0.5
    y, s = ops.npu_dynamic_quant(x, smooth_scales=sm)
    q, sr = quant_rows(x.float() * sm)
    assert y.shape == x.shape and s.shape == (2, 5)
    assert (y.int() - q.int()).abs().max() <= 1 and torch.allclose(s, sr)
    x2 = torch.randn(10, 16).to(BF)
    sms = torch.rand(3, 16) + 0.5
    gi = torch.tensor([4, 4, 9], dtype=torch.int32)  # rows 4..9 of group 2 from 4; row 9 past
    y2, s2 = ops.npu_dynamic_quant(x2, smooth_scales=sms, group_index=gi)
    rows = torch.cat([x2[:4].float() * sms[0], x2[4:9].float() * sms[2]])
    q2, sr2 = quant_rows(rows)
    assert (y2[:9].int() - q2.int()).abs().max() <= 1 and torch.allclose(s2[:9], sr2)
    assert bool((y2[9] == 0).all()) and s2[9] == 0
    y4, s4 = ops.npu_dynamic_quant(x2, dst_type=torch.quint4x2)
    assert y4.dtype == torch.int32 and y4.shape == (10, 2)
    nib = torch.stack([(y4 >> (4 * i)) & 0xF for i in range(8)], -1).reshape(10, 16)
    nib = torch.where(nib >= 8, nib - 16, nib)
    q4, sr4 = quant_rows(x2.float(), 7.0)
    assert (nib - q4.long()).abs().max() <= 1 and torch.allclose(s4, sr4)


def _dsq_ref(x, ws, act, counts, left=True, qs=None, mode=0, limit=7.0, alpha=1.702, gbias=1.0):
    v = x.double()
    if ws is not None:
        rows = []
        start = 0
        for g, c in enumerate(counts):
            rows.append(v[start:start + c] * ws[g].double())
            start += c
        v = torch.cat(rows + [torch.zeros(x.shape[0] - start, x.shape[1], dtype=F64)])
    if act is not None:
        v = v * act.reshape(-1, 1).double()
    h = x.shape[1] // 2
    if mode == 1:
        y = clipped_glu(v[:, 0::2], v[:, 1::2], alpha, limit, gbias)
    else:
        a, b = (v[:, :h], v[:, h:]) if left else (v[:, h:], v[:, :h])
        y = silu(a) * b if mode == 0 else clipped_glu(a, b, alpha, limit, gbias)
    if qs is not None:
        start = 0
        for g, c in enumerate(counts):
            y[start:start + c] *= qs[g].double()
            start += c
    return quant_rows(y)


@pytest.mark.parametrize("left,mode", [(True, 0), (False, 0), (True, 1), (True, 2)])
def test_dequant_swiglu_quant_int32_groups(left, mode):
    t, h2 = 11, 32
    counts = [3, 0, 5]  # 8 of 11 rows
    x = torch.randint(-3000, 3000, (t, h2), dtype=torch.int32)
    ws = torch.rand(3, h2) * 1e-3
    act = torch.rand(t) + 0.5
    qs = torch.rand(3, h2 // 2) + 0.5
    y, s = ops.npu_dequant_swiglu_quant(x, weight_scale=ws, activation_scale=act.reshape(t, 1),
                                        quant_scale=qs, group_index=torch.tensor(counts),
                                        activate_left=left, quant_mode=1, swiglu_mode=mode)
    q, sr = _dsq_ref(x, ws, act, counts, left, qs, mode)
    assert y.shape == (t, 16) and s.shape == (t,)
    assert (y[:8].int() - q[:8].int()).abs().max() <= 1
    assert torch.allclose(s[:8], sr[:8], rtol=1e-5)
    assert bool((y[8:] == 0).all()) and bool((s[8:] == 0).all())
    # the dispatch's 1-D dynamic_scale works as activation_scale too (vLLM)
    y1, s1 = ops.npu_dequant_swiglu_quant(x, weight_scale=ws, activation_scale=act,
                                          quant_scale=qs, group_index=torch.tensor(counts),
                                          activate_left=left, quant_mode=1, swiglu_mode=mode)
    assert torch.equal(y1, y) and torch.equal(s1, s)


def test_dequant_swiglu_quant_bf16_no_scales_and_int32_bias():
    x = torch.randn(6, 20).to(BF)
    y, s = ops.npu_dequant_swiglu_quant(x, activate_left=True, quant_mode="dynamic")
    q, sr = quant_rows(swiglu(x))
    assert (y.int() - q.int()).abs().max() <= 1 and torch.allclose(s, sr, rtol=1e-5)
    xi = torch.randint(-100, 100, (4, 8), dtype=torch.int32)
    b = torch.randint(-50, 50, (8,), dtype=torch.int32)
    ws = torch.rand(8) * 0.01
    y2, s2 = ops.npu_dequant_swiglu_quant(xi, weight_scale=ws, bias=b, activate_left=True,
                                          quant_mode=1)
    q2, sr2 = quant_rows(swiglu((xi + b).double() * ws.double()))
    assert (y2.int() - q2.int()).abs().max() <= 1 and torch.allclose(s2, sr2, rtol=1e-5)


# ---- routing ------------------------------------------------------------------------------------

def _init_routing_ref(x, ids, active_num, s, e, quant_mode, scale, row_idx_type, tok_type,
                      expert_num):
    n, k = ids.shape
    inr, out = stable_order(ids, s, e)
    order = inr + out
    r = n * k if active_num <= 0 else min(active_num, n * k)
    rows = min(len(inr), r)
    if quant_mode == -1:
        ex = torch.zeros(r, x.shape[1], dtype=x.dtype)
        for j in range(rows):
            ex[j] = x[order[j] // k]
        es = torch.zeros(r)
        if scale is not None:
            for j in range(rows):
                es[j] = scale[order[j] // k]
    else:
        v = torch.stack([x[order[j] // k].float() * (scale[0] if scale.shape[0] == 1 else
                                                    scale[ids.reshape(-1)[order[j]] - s])
                         for j in range(rows)]) if scale is not None else \
            torch.stack([x[order[j] // k].float() for j in range(rows)])
        q, sc = quant_rows(v)
        ex = torch.zeros(r, x.shape[1], dtype=torch.int8)
        ex[:rows] = q
        es = torch.zeros(r)
        es[:rows] = sc
    ri = torch.full((n * k,), -1, dtype=torch.int32)
    if row_idx_type == 0:
        for j in range(rows):
            ri[order[j]] = j
    else:
        for j in range(len(inr)):
            ri[j] = order[j]
    flat = ids.reshape(-1).tolist()
    cnt = [sum(1 for v in flat if v == ex_id) for ex_id in range(s, e)]
    if tok_type == 0:
        tok = torch.tensor(cnt).cumsum(0)
    elif tok_type == 1:
        tok = torch.tensor(cnt)
    else:
        tok = torch.zeros(expert_num, 2, dtype=torch.int64)
        used = [(s + i, c) for i, c in enumerate(cnt) if c]
        for i, (a, c) in enumerate(used):
            tok[i, 0], tok[i, 1] = a, c
    return ex, ri, tok, es


@pytest.mark.parametrize("case", [
    dict(active_num=-1, rng=[], quant=-1, rit=0, tt=1),
    dict(active_num=-1, rng=[4, 12], quant=-1, rit=0, tt=1),  # vLLM AllGather local range
    dict(active_num=9, rng=[], quant=-1, rit=1, tt=0),        # active_num truncation, scatter
    dict(active_num=-1, rng=[2, 10], quant=1, rit=0, tt=2),   # dynamic int8 + smooth, pairs
    dict(active_num=-1, rng=[], quant=1, rit=0, tt=1, smooth1=True),
])
def test_init_routing_v2(case):
    n, k, h, e = 7, 3, 16, 16
    x = torch.randn(n, h).to(BF)
    ids = torch.stack([torch.randperm(e)[:k] for _ in range(n)]).to(torch.int32)
    s, en = (case["rng"] if case["rng"] else (0, e))
    scale = None
    if case["quant"] == 1:
        scale = torch.rand(1 if case.get("smooth1") else en - s, h) + 0.5
    out = ops.npu_moe_init_routing_v2(
        x, ids, scale=scale, active_num=case["active_num"], expert_num=e,
        expert_tokens_num_type=case["tt"], expert_tokens_num_flag=True,
        quant_mode=case["quant"], active_expert_range=case["rng"], row_idx_type=case["rit"])
    ref = _init_routing_ref(x, ids, case["active_num"], s, en, case["quant"], scale, case["rit"],
                            case["tt"], e)
    names = ("expanded_x", "expanded_row_idx", "expert_tokens", "expanded_scale")
    for name, got, want in zip(names, out, ref):
        assert got.shape == want.shape, name
        if name == "expanded_x" and case["quant"] == 1:
            assert (got.int() - want.int()).abs().max() <= 1, name
        elif name == "expanded_scale":
            assert torch.allclose(got, want.float()), name
        else:
            assert torch.equal(got, want.to(got.dtype)), name


def test_init_routing_v2_int8_with_scale_and_capacity():
    n, k, h, e = 6, 2, 8, 4
    x = torch.randint(-100, 100, (n, h), dtype=torch.int8)
    sc = torch.rand(n)
    ids = torch.tensor([[0, 1], [1, 2], [0, 3], [1, 0], [2, 3], [1, 2]], dtype=torch.int32)
    ex, ri, tok, es = ops.npu_moe_init_routing_v2(x, ids, scale=sc, expert_num=e,
                                                  expert_tokens_num_flag=True,
                                                  active_expert_range=[0, e],
                                                  x_dtype=torch.int8, expert_tokens_num_type=1)
    ref = _init_routing_ref(x, ids, -1, 0, e, -1, sc, 0, 1, e)
    assert torch.equal(ex, ref[0]) and torch.equal(ri, ref[1]) and torch.equal(es, ref[3])
    # capacity 2: each expert's first two pairs, zero padding, dropped pairs -1
    ex, ri, tok, es = ops.npu_moe_init_routing_v2(x.float(), ids, expert_num=e, drop_pad_mode=1,
                                                  expert_capacity=2, expert_tokens_num_type=1)
    assert ex.shape == (e, 2, h)
    seen = {}
    for i, eid in enumerate(ids.reshape(-1).tolist()):
        c = seen.get(eid, 0)
        seen[eid] = c + 1
        if c < 2:
            assert ri[i] == eid * 2 + c and torch.equal(ex[eid, c], x[i // k].float())
        else:
            assert ri[i] == -1
    assert tok.tolist() == [3, 4, 3, 2]


def test_finalize_routing_modes_skips_bias_and_alias():
    n, k, h, e = 5, 2, 8, 3
    rows = torch.randn(n * k, h).to(BF)
    skip1, skip2 = torch.randn(n, h).to(BF), torch.randn(n, h).to(BF)
    bias = torch.randn(e, h).to(BF)
    scales = torch.rand(n, k)
    idx2 = torch.randperm(n * k).to(torch.int32)  # token-major (mode 2)
    idx2[3] = -1
    efr = torch.randint(0, e, (n, k), dtype=torch.int32)
    out = ops.npu_moe_finalize_routing(rows, skip1, skip2, bias, scales, idx2, efr,
                                       drop_pad_mode=2)
    ref = skip1.double() + skip2.double()
    for t in range(n):
        for j in range(k):
            r = int(idx2[t * k + j])
            row = rows[r].double() if r >= 0 else torch.zeros(h, dtype=F64)
            ref[t] += scales[t, j].double() * (row + bias[efr[t, j]].double())
    close(out, ref, "mode 2")
    # mode 0: k-major index; the docs' keyword spelling
    idx0 = idx2.reshape(n, k).t().reshape(-1).contiguous()
    out0 = ops.npu_moe_finalize_routing(rows, skip1, skip2, bias, scales, idx0,
                                        expert_for_source_row=efr, drop_pad_mode=0)
    assert torch.equal(out0, out)
    # sglang: no skips, no bias, fp32 scales with bf16 rows
    out3 = ops.npu_moe_finalize_routing(rows, None, None, None, scales, idx2, efr,
                                        drop_pad_mode=2)
    ref3 = torch.zeros(n, h, dtype=F64)
    for t in range(n):
        for j in range(k):
            r = int(idx2[t * k + j])
            if r >= 0:
                ref3[t] += scales[t, j].double() * rows[r].double()
    close(out3, ref3, "no skips")


@pytest.mark.parametrize("num_out", [None, 0, 10, -3])
def test_token_permute_unpermute_and_gradients(num_out):
    t, k, h, e = 6, 3, 8, 5
    tokens = torch.randn(t, h).to(BF).requires_grad_()
    idx = torch.randint(0, e, (t, k), dtype=torch.int64)
    perm, si = ops.npu_moe_token_permute(tokens, idx, num_out_tokens=num_out)
    nk = t * k
    r = nk if not num_out else (min(num_out, nk) if num_out > 0 else nk + num_out)
    first, _ = stable_order(idx)
    assert si.dtype == torch.int32 and perm.shape == (r, h)
    for j in range(nk):
        assert si[first[j]] == j
        if j < r:
            assert torch.equal(perm[j], tokens.detach()[first[j] // k])
    probs = torch.rand(t, k, requires_grad=True)  # HyperParallel: fp32 probs, bf16 tokens
    out = ops.npu_moe_token_unpermute(perm, si, probs=probs)
    ref = torch.zeros(t, h, dtype=F64)
    for a in range(t):
        for j in range(k):
            d = int(si[a * k + j])
            if d < r:
                ref[a] += probs[a, j].double() * perm[d].double()
    close(out, ref, "unpermute")
    g = torch.randn(t, h).to(BF)
    out.backward(g)
    # reference gradients through plain torch indexing
    tok_r = tokens.detach().double().requires_grad_()
    probs_r = probs.detach().double().requires_grad_()
    rows = tok_r[torch.tensor(first[:r]) // k]
    sel = si.long().reshape(t, k)
    gathered = torch.cat([rows, torch.zeros(1, h, dtype=F64)])[sel.clamp(max=r)]
    (gathered * probs_r.unsqueeze(-1)).sum(1).backward(g.double())
    close(tokens.grad, tok_r.grad, "d tokens")
    close(probs.grad, probs_r.grad, "d probs")


def test_token_permute_1d_indices_and_unpermute_duplicates():
    tokens = torch.randn(5, 4)
    ids = torch.tensor([2, 0, 1, 0, 2], dtype=torch.int32)
    perm, si = ops.npu_moe_token_permute(tokens, ids)
    assert torch.equal(perm, tokens[torch.tensor([1, 3, 2, 0, 4])])
    back = ops.npu_moe_token_unpermute(perm, si)
    assert torch.equal(back, tokens)
    # vLLM AllGather: abs(row idx) turns -1 into 1 (duplicates) with zero probs
    rows = torch.randn(4, 3)
    si2 = torch.tensor([1, 1, 0, 2, 1, 3], dtype=torch.int32)
    probs = torch.tensor([[0.0, 0.5], [0.25, 1.0], [0.0, 0.0]])
    out = ops.npu_moe_token_unpermute(rows, si2, probs=probs, restore_shape=torch.Size([3, 3]))
    ref = torch.stack([0.5 * rows[1], 0.25 * rows[0] + rows[2], torch.zeros(3)])
    assert torch.allclose(out, ref)


def _gating_ref(x, k, bias, k_group, group_count, mode, norm_type, sf, eps=1e-20):
    xd = x.double()
    norm = torch.softmax(xd, -1) if norm_type == 0 else torch.sigmoid(xd)
    sc = norm + (bias.double() if bias is not None else 0)
    n, e = x.shape
    ys, ids = [], []
    for r in range(n):
        c = sc[r].clone()
        if group_count > 1:
            g = c.reshape(group_count, -1)
            gs = g.max(1).values if mode == 0 else g.topk(2, 1).values.sum(1)
            keep = sorted(range(group_count), key=lambda i: (-float(gs[i]), i))[:k_group]
            mask = torch.full((group_count, e // group_count), float("-inf"), dtype=F64)
            for i in keep:
                mask[i] = 0
            c = c + mask.reshape(-1)
        pick = sorted(range(e), key=lambda i: (-float(c[i]), i))[:k]
        y = norm[r, pick]
        if norm_type == 1:
            y = y / (y.sum() + eps)
        ys.append(y * sf)
        ids.append(pick)
    return torch.stack(ys), torch.tensor(ids, dtype=torch.int32), norm


@pytest.mark.parametrize("norm_type,groups", [(0, 1), (1, 8), (1, 1)])
def test_gating_top_k(norm_type, groups):
    n, e, k = 9, 32, 6
    x = torch.randn(n, e)
    bias = torch.randn(e) * 0.1 if norm_type == 1 else None
    kg = 4 if groups > 1 else 1
    y, idx, norm = ops.npu_moe_gating_top_k(x, k, bias=bias, k_group=kg, group_count=groups,
                                            group_select_mode=1, norm_type=norm_type,
                                            routed_scaling_factor=2.5)
    yr, ir, nr = _gating_ref(x, k, bias, kg, groups, 1, norm_type, 2.5)
    assert torch.equal(idx, ir)
    assert torch.allclose(y.double(), yr, rtol=1e-5, atol=1e-7)
    assert torch.allclose(norm.double(), nr, rtol=1e-5, atol=1e-7)
    # ties go to the lower expert index; bf16 x gives bf16 y
    y2, i2, _ = ops.npu_moe_gating_top_k(torch.zeros(2, 8).to(BF), 3)
    assert i2.tolist() == [[0, 1, 2], [0, 1, 2]] and y2.dtype == BF


def test_update_expert_balance_and_pruning():
    table = torch.tensor([[1, 10, 0, 0], [2, 11, 12, 0], [3, 13, 14, 15]], dtype=torch.int32)
    ids = torch.tensor([[0, 1, 2], [2, 1, 0]], dtype=torch.int32)
    b0, m0 = ops.npu_moe_update_expert(ids, table, local_rank_id=3, world_size=4, balance_mode=0)
    # c = 1: col 1; c = 2: 3 // 2 + 1 = 2; c = 3: 3 // ceil(4/3)=2 -> 1 + 1 = 2
    assert b0.tolist() == [[10, 12, 14], [14, 12, 10]] and bool(m0.all())
    b1, _ = ops.npu_moe_update_expert(ids, table, balance_mode=1)
    assert b1.tolist() == [[10, 11, 13], [14, 12, 10]]
    sc = torch.tensor([[0.6, 0.3, 0.1], [0.5, 0.4, 0.1]])
    thr = torch.tensor([0.0, 0.3, 0.2])
    _, m = ops.npu_moe_update_expert(ids, table, expert_scales=sc, pruning_threshold=thr,
                                     active_mask=torch.tensor([True, False]), balance_mode=1)
    assert m.tolist() == [[True, True, False], [False, False, False]]


def test_gmm_packed_weight_cache_follows_the_tensor():
    import gc
    from megamoe import companion
    e, k, n, m = 3, 64, 128, 12
    counts = [4, 4, 4]
    x = torch.randn(m, k).to(BF)
    w = torch.randn(e, n, k).to(BF)  # vLLM's [E, N, K] tensor, passed as a transposed view
    gc.collect()  # packs of earlier tests' weights that only a collection frees
    before = companion.packed_weight_bytes()
    gl = torch.tensor(counts)

    def run():
        return ops.npu_grouped_matmul([x], [w.transpose(1, 2)], group_list=gl, split_item=2,
                                      group_type=0, group_list_type=1)[0]
    close(run(), gmm(x, w.transpose(1, 2), counts), "first call")
    held = companion.packed_weight_bytes()
    assert held > before  # one packed copy, reused by the next calls (a new view each time)
    close(run(), gmm(x, w.transpose(1, 2), counts), "second call")
    assert companion.packed_weight_bytes() == held
    with torch.no_grad():
        w.mul_(-2)  # an in-place update (an optimizer step, a weight reload): re-packed
    close(run(), gmm(x, w.transpose(1, 2), counts), "after an in-place change")
    w.data = torch.randn(e, n, k).to(BF)  # new storage: a new pack replaces the old one
    close(run(), gmm(x, w.transpose(1, 2), counts), "after replacing the data")
    assert companion.packed_weight_bytes() == held
    del w
    gc.collect()
    assert companion.packed_weight_bytes() == before  # freed with the tensor


# ---- quantised grouped matmul (W8A8, W8A16, A8W4) and the fused gmm + swiglu + quant ---------

def _qweights(e, k, n, g=None, groups=1):
    """int8 weights [E, K, N] with per-channel (or per K-group) fp32 scales and their fp64
    dequantisation."""
    g = g or torch.Generator().manual_seed(5)
    w = torch.randn(e, k, n, generator=g)
    gs = k // groups
    wg = w.reshape(e, groups, gs, n)
    s = wg.abs().amax(2) / 127.0  # [E, G, N]
    q = torch.round(wg / s.unsqueeze(2)).clamp(-127, 127).to(torch.int8).reshape(e, k, n)
    deq = (q.double().reshape(e, groups, gs, n) * s.double().unsqueeze(2)).reshape(e, k, n)
    return q, (s[:, 0] if groups == 1 else s), deq


def _int64_coded(s):
    return s.contiguous().view(torch.int32).to(torch.int64) & 0xFFFFFFFF


def test_gmm_w8a8_int32_and_dequantised_outputs():
    e, k, n, m = 4, 96, 128, 21
    counts = [6, 0, 9, 3]  # 18 of 21 rows
    gl = torch.tensor(counts).cumsum(0)
    x = torch.randint(-127, 128, (m, k), dtype=torch.int8)
    q, s, _ = _qweights(e, k, n)
    exact = torch.zeros(m, n, dtype=torch.int64)
    start = 0
    for g, c in enumerate(counts):
        exact[start:start + c] = x[start:start + c].long() @ q[g].long()
        start += c
    y = ops.npu_grouped_matmul([x], [q], group_list=gl, split_item=3, group_type=0,
                               output_dtype=torch.int32)[0]
    assert y.dtype == torch.int32 and torch.equal(y.long(), exact)
    b32 = torch.randint(-1000, 1000, (e, n), dtype=torch.int32)
    yb = ops.npu_grouped_matmul([x], [q], bias=[b32], group_list=gl, split_item=3, group_type=0,
                                output_dtype=torch.int32)[0]
    bias_rows = torch.cat([b32[g].long().expand(c, n) for g, c in enumerate(counts)])
    assert torch.equal(yb[:18].long(), exact[:18] + bias_rows) and bool((yb[18:] == 0).all())
    pt = torch.rand(m) + 0.5
    for scale, out_dtype in ((s.to(BF), BF), (s, torch.float16), (_int64_coded(s), BF),
                             (s, torch.float32)):
        y = ops.npu_grouped_matmul([x], [q], scale=[scale], per_token_scale=[pt], group_list=gl,
                                   split_item=2, group_type=0, output_dtype=out_dtype)[0]
        sd = s.to(BF).double() if scale.dtype == BF else s.double()
        ref = torch.zeros(m, n, dtype=F64)
        start = 0
        for g, c in enumerate(counts):
            ref[start:start + c] = exact[start:start + c].double() * sd[g] * \
                pt[start:start + c, None].double()
            start += c
        assert y.dtype == out_dtype
        close(y, ref, f"W8A8 {scale.dtype} -> {out_dtype}")
    # a vLLM dynamic_eplb weight list with per-expert scales, and the [N, K] transposed view
    wl = [q[i] for i in range(e)]
    yl = ops.npu_grouped_matmul([x], wl, scale=[s[i] for i in range(e)], per_token_scale=[pt],
                                group_list=gl, split_item=2, group_type=0, output_dtype=BF)[0]
    yt = ops.npu_grouped_matmul([x], [q.transpose(1, 2).contiguous().transpose(1, 2)],
                                scale=[s], per_token_scale=[pt], group_list=gl, split_item=2,
                                group_type=0, output_dtype=BF)[0]
    y0 = ops.npu_grouped_matmul([x], [q], scale=[s], per_token_scale=[pt], group_list=gl,
                                split_item=2, group_type=0, output_dtype=BF)[0]
    assert torch.equal(yl, y0) and torch.equal(yt, y0)
    with pytest.raises(ValueError, match="needs scale"):
        ops.npu_grouped_matmul([x], [q], group_list=gl, split_item=2, group_type=0,
                               output_dtype=BF)


@pytest.mark.parametrize("groups", [1, 3])
def test_gmm_w8a16_antiquant(groups):
    e, k, n, m = 3, 96, 64, 11
    counts = [4, 7, 0]
    x = torch.randn(m, k).to(BF)
    q, s, _ = _qweights(e, k, n, groups=groups)
    off = torch.randn(s.shape)
    y = ops.npu_grouped_matmul([x], [q], antiquant_scale=[s], antiquant_offset=[off],
                               group_list=torch.tensor(counts), group_list_type=1, split_item=2,
                               group_type=0)[0]
    w = q.double().reshape(e, groups, k // groups, n)
    s3 = s.reshape(e, groups, n).double().unsqueeze(2)
    o3 = off.reshape(e, groups, n).double().unsqueeze(2)
    deq = ((w + o3) * s3).reshape(e, k, n)
    close(y, gmm(x, deq, counts), f"W8A16 groups {groups}")


def _pack_int4(v):
    """int4 values [.., N] -> int32 [.., N/8], element 8m + i in bits 4i..4i+3."""
    u = (v.to(torch.int64) & 0xF).reshape(*v.shape[:-1], -1, 8)
    w = sum(u[..., i] << (4 * i) for i in range(8))
    return torch.where(w >= 2 ** 31, w - 2 ** 32, w).to(torch.int32)


def test_gmm_a8w4_device_formula():
    e, k, n, m = 2, 64, 64, 9
    counts = [5, 4]
    g = torch.Generator().manual_seed(9)
    v = torch.randint(-8, 8, (e, k, n), generator=g)
    s = torch.rand(e, n, generator=g) * 0.01
    x = torch.randint(-127, 128, (m, k), dtype=torch.int8, generator=g)
    pt = torch.rand(m, generator=g) + 0.5
    bias = 8 * (v.double() * s.double().unsqueeze(1)).sum(1)  # vLLM's w_scale_bias
    y = ops.npu_grouped_matmul([x], [_pack_int4(v)], scale=[_int64_coded(s)], bias=[bias.float()],
                               per_token_scale=[pt], group_list=torch.tensor(counts),
                               group_list_type=1, split_item=2, group_type=0,
                               output_dtype=BF)[0]
    ref = torch.zeros(m, n, dtype=F64)
    start = 0
    for gi, c in enumerate(counts):
        ws = v[gi].double() * s[gi].double()
        # the device: ((x - 8) @ (W s) + bias) * p, with the caller's bias = 8 colsum(W s)
        ref[start:start + c] = ((x[start:start + c].double() - 8) @ ws + bias[gi]) * \
            pt[start:start + c, None].double()
        start += c
    close(y, ref, "A8W4")


@pytest.mark.parametrize("groups", [1, 4])
def test_gmm_a8w4_cached_column_sums_follow_weights_and_scales(groups):
    """A8W4's -8 colsum(W s) term comes from column sums kept with the packed weight (per K
    group): they must follow an in-place weight update and the call's (changing) scales.
    groups > 1: the per-group scale [E, G, N] (swiglu_quant_v2's dequant_mode 1)."""
    e, k, n, m = 2, 64, 64, 9
    counts = [5, 4]
    g = torch.Generator().manual_seed(11)
    v = torch.randint(-8, 8, (e, k, n), generator=g)
    x = torch.randint(-127, 128, (m, k), dtype=torch.int8, generator=g)
    pt = torch.rand(m, generator=g) + 0.5
    w = _pack_int4(v)

    def ref(v, s):
        out = torch.zeros(m, n, dtype=F64)
        start = 0
        for gi, c in enumerate(counts):
            ws = (v[gi].double().reshape(groups, k // groups, n) *
                  s[gi].double().unsqueeze(1)).reshape(k, n)
            out[start:start + c] = ((x[start:start + c].double() - 8) @ ws) * \
                pt[start:start + c, None].double()
            start += c
        return out

    def run(s):
        return ops.npu_grouped_matmul([x], [w], scale=[s], per_token_scale=[pt],
                                      group_list=torch.tensor(counts), group_list_type=1,
                                      split_item=2, group_type=0, output_dtype=torch.float32)[0]
    s1 = torch.rand(e, groups, n, generator=g) * 0.01
    close(run(s1), ref(v, s1), "first call")
    close(run(s1), ref(v, s1), "second call (the kept pack)")
    s2 = torch.rand(e, groups, n, generator=g) * 0.02  # new scales, same packed weight
    close(run(s2), ref(v, s2), "new scales")
    v2 = torch.randint(-8, 8, (e, k, n), generator=g)
    with torch.no_grad():
        w.copy_(_pack_int4(v2))  # in place: re-packed, column sums remade
    close(run(s2), ref(v2, s2), "after an in-place weight update")


def test_grouped_matmul_swiglu_quant_v2_a8w4_per_group():
    """A8W4 with per-K-group scales (dequant_mode 1) and the weight-assist matrix 8 colsum(W s):
    the device's ((X - 8)(W s) + assist) p, i.e. X (W s) p, then SwiGLU and per-row int8."""
    e, k, n, m, groups = 2, 64, 64, 11, 4
    counts = [6, 3]  # 9 of 11 rows
    g = torch.Generator().manual_seed(13)
    v = torch.randint(-8, 8, (e, k, n), generator=g)
    s = torch.rand(e, groups, n, generator=g) * 0.01
    ws = (v.double().reshape(e, groups, k // groups, n) * s.double().unsqueeze(2)).reshape(e, k, n)
    assist = 8 * ws.sum(1)
    x = torch.randint(-127, 128, (m, k), dtype=torch.int8, generator=g)
    xs = torch.rand(m, generator=g) + 0.5
    out, scale = ops.npu_grouped_matmul_swiglu_quant_v2(
        x, [_pack_int4(v)], [s], xs, torch.tensor(counts), weight_assist_matrix=[assist.float()],
        dequant_mode=1, group_list_type=1)
    c = torch.zeros(m, n, dtype=F64)
    start = 0
    for gi, cnt in enumerate(counts):
        c[start:start + cnt] = (x[start:start + cnt].double() @ ws[gi]) * \
            xs[start:start + cnt, None].double()
        start += cnt
    qr, sr = quant_rows(swiglu(c)[:9])
    assert (out[:9].int() - qr.int()).abs().max() <= 1
    assert torch.allclose(scale[:9], sr, rtol=1e-4)
    assert (out[9:] == 0).all() and (scale[9:] == 0).all()


@pytest.mark.parametrize("v2", [False, True])
def test_grouped_matmul_swiglu_quant(v2):
    e, k, n, m = 3, 64, 96, 13
    counts = [5, 0, 6]  # 11 of 13 rows
    q, s, deq = _qweights(e, k, n)
    x = torch.randint(-127, 128, (m, k), dtype=torch.int8)
    xs = torch.rand(m) + 0.5
    cum = torch.tensor(counts).cumsum(0)
    if v2:
        smooth = torch.rand(e, n // 2) + 0.5
        out, scale = ops.npu_grouped_matmul_swiglu_quant_v2(x, [q], [s], xs, cum,
                                                            smooth_scale=smooth)
    else:
        smooth = None
        out, scale, off = ops.npu_grouped_matmul_swiglu_quant(x=x, weight=q, group_list=cum,
                                                              weight_scale=_int64_coded(s),
                                                              x_scale=xs)
        assert off.dim() == 0 and float(off) == 0
    c = torch.zeros(m, n, dtype=F64)
    start = 0
    for g, cnt in enumerate(counts):
        c[start:start + cnt] = (x[start:start + cnt].long() @ q[g].long()).double() * \
            s[g].double() * xs[start:start + cnt, None].double()
        start += cnt
    a = swiglu(c)
    if smooth is not None:
        start = 0
        for g, cnt in enumerate(counts):
            a[start:start + cnt] *= smooth[g].double()
            start += cnt
    qr, sr = quant_rows(a[:11])
    assert out.dtype == torch.int8 and out.shape == (m, n // 2) and scale.shape == (m,)
    assert (out[:11].int() - qr.int()).abs().max() <= 1
    assert torch.allclose(scale[:11], sr, rtol=1e-5)
    assert bool((out[11:] == 0).all()) and bool((scale[11:] == 0).all())
