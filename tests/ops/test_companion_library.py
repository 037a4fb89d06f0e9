"""The companion operators as torch.ops.megamoe.* (megamoe/_library.py): every entry point goes
through the dispatcher to its body, the fake kernels give the real outputs' shapes and dtypes on
meta tensors (torch 1.13 too), the gradients of npu_swiglu / token permute / unpermute are the
operators' (npu_swiglu_backward, moe_token_permute_backward, moe_token_unpermute_backward), and
on torch >= 2.4 torch.library.opcheck passes for each case (fake, autograd registration,
schema). Single process."""
import pytest
import torch

import megamoe.ops as ops
from megamoe import _library
from megamoe import companion as _comp
from megamoe import companion_routing as _route

BF = torch.bfloat16
torch.manual_seed(1)


def _qw(e, k, n):
    return torch.randint(-127, 128, (e, k, n), dtype=torch.int8), torch.rand(e, n) * 1e-2


def _cases():
    """(name, args, kwargs, dynamic): representative calls of every operator; dynamic = output
    rows only the data decides (a group list's split)."""
    q, s = _qw(2, 64, 32)
    xq = torch.randint(-127, 128, (10, 64), dtype=torch.int8)
    cum = torch.tensor([6, 10])
    return [
        ("npu_grouped_matmul", ([torch.randn(12, 32).to(BF)], [torch.randn(3, 32, 16).to(BF)]),
         dict(group_list=torch.tensor([4, 0, 8]), split_item=3, group_type=0,
              group_list_type=1), False),
        ("npu_grouped_matmul", ([torch.randn(12, 32).to(BF)], [torch.randn(3, 32, 16).to(BF)]),
         dict(group_list=torch.tensor([4, 4, 12]), split_item=0, group_type=0), True),
        ("npu_grouped_matmul", ([torch.randn(5, 32).to(BF), torch.randn(2, 3, 32).to(BF)],
                                [torch.randn(32, 16).to(BF), torch.randn(32, 8).to(BF)]),
         dict(output_dtype=torch.float32), False),
        ("npu_grouped_matmul", ([xq], [q]),
         dict(scale=[s], per_token_scale=[torch.rand(10)], group_list=cum, split_item=3,
              group_type=0, output_dtype=BF), False),
        ("npu_swiglu", (torch.randn(3, 4, 32).to(BF),), dict(dim=-1), False),
        ("npu_swiglu", (torch.randn(3, 8, 5),), dict(dim=1), False),
        ("npu_clipped_swiglu", (torch.randn(10, 32).to(BF),),
         dict(group_index=torch.tensor([6]), interleaved=False), False),
        ("npu_dynamic_quant", (torch.randn(2, 7, 64).to(BF),),
         dict(smooth_scales=torch.rand(64) + 0.5), False),
        ("npu_dynamic_quant", (torch.randn(7, 64).to(BF),), dict(dst_type=torch.quint4x2), False),
        ("npu_dequant_swiglu_quant", (torch.randint(-3000, 3000, (9, 32), dtype=torch.int32),),
         dict(weight_scale=torch.rand(2, 32) * 1e-3, activation_scale=torch.rand(9) + 0.5,
              group_index=torch.tensor([5, 4]), quant_mode=1), False),
        ("npu_grouped_matmul_swiglu_quant", (xq, q, cum, s, torch.rand(10) + 0.5), {}, False),
        ("npu_grouped_matmul_swiglu_quant_v2", (xq, [q], [s], torch.rand(10) + 0.5, cum),
         dict(smooth_scale=torch.rand(2, 16) + 0.5), False),
        ("npu_moe_init_routing_v2", (torch.randn(8, 16).to(BF),
                                     torch.randint(0, 4, (8, 2), dtype=torch.int32)),
         dict(active_num=16, expert_num=4, expert_tokens_num_type=1,
              expert_tokens_num_flag=True), False),
        ("npu_moe_init_routing_v2", (torch.randn(8, 16).to(BF),
                                     torch.randint(0, 4, (8, 2), dtype=torch.int32)),
         dict(expert_num=4, quant_mode=1, expert_tokens_num_flag=True), False),
        ("npu_moe_finalize_routing", (torch.randn(16, 8).to(BF), torch.randn(8, 8).to(BF), None,
                                      None, torch.rand(8, 2),
                                      torch.randperm(16).to(torch.int32)),
         dict(drop_pad_mode=2), False),
        ("npu_moe_token_permute", (torch.randn(8, 16).to(BF),
                                   torch.randint(0, 4, (8, 2), dtype=torch.int32)),
         dict(num_out_tokens=12), False),
        ("npu_moe_token_unpermute", (torch.randn(16, 16).to(BF),
                                     torch.randperm(16).to(torch.int32)),
         dict(probs=torch.rand(8, 2)), False),
        ("npu_moe_gating_top_k", (torch.randn(9, 32), 6),
         dict(bias=torch.randn(32) * 0.1, k_group=2, group_count=4, group_select_mode=1,
              norm_type=1), False),
        ("npu_moe_update_expert", (torch.tensor([[0, 1], [2, 1]], dtype=torch.int32),
                                   torch.tensor([[1, 10, 0], [2, 11, 12], [1, 13, 0]],
                                                dtype=torch.int32)),
         dict(balance_mode=1), False),
    ]


CASES = _cases()
IDS = [f"{c[0]}-{i}" for i, c in enumerate(CASES)]


def _entry(name):
    """The Operator (torch.ops.megamoe.<name>'s Python entry) behind ops.<name>."""
    fn = ops._companion.OPERATORS[name]
    return getattr(fn, "operator", fn)


def _map(v, fn):
    if isinstance(v, torch.Tensor):
        return fn(v)
    if isinstance(v, (list, tuple)):
        return type(v)(_map(x, fn) for x in v)
    if isinstance(v, dict):
        return {k: _map(x, fn) for k, x in v.items()}
    return v


def _flat(out):
    if isinstance(out, torch.Tensor):
        return [out]
    return [t for o in out for t in _flat(o)]


def test_every_operator_is_a_torch_op_and_runs_through_the_dispatcher():
    names = set(ops._companion.OPERATORS)
    for name in names:
        op = _entry(name)
        assert isinstance(op, _library.Operator) and op.qualname == f"megamoe::{name}", name
        assert hasattr(torch.ops.megamoe, name)
        assert not op.collective  # local: no effect token, free to reorder
    called = set()
    for name, args, kwargs, _ in CASES:
        op = _entry(name)
        before = op.body_calls
        getattr(ops, name)(*args, **kwargs)
        assert op.body_calls == before + 1, f"{name}: the body did not run through torch.ops"
        called.add(name)
    assert called == names
    for internal in ("npu_swiglu_backward", "moe_token_permute_backward",
                     "moe_token_unpermute_backward"):
        assert hasattr(torch.ops.megamoe, internal)


def test_dtype_arguments_take_torch_npu_codes():
    x = torch.randn(6, 32).to(BF)
    w = torch.randn(32, 8).to(BF)
    a = ops.npu_grouped_matmul([x], [w], output_dtype=torch.float32)[0]
    b = ops.npu_grouped_matmul([x], [w], output_dtype=6)[0]  # c10 / torch_npu code of float32
    assert a.dtype == b.dtype == torch.float32 and torch.equal(a, b)
    t = torch.ops.megamoe.npu_grouped_matmul([x], [w], output_dtype=6)[0]  # the raw op
    assert torch.equal(t, a)
    with pytest.raises(ValueError, match="Ascend 950"):
        ops.npu_grouped_matmul([x], [w], x_dtype=291)  # torch_npu's float8_e5m2
    y = ops.npu_dequant_swiglu_quant(torch.randn(4, 16).to(BF), quant_mode="dynamic",
                                     dst_type=torch.int8, round_mode="rint")[0]
    assert y.dtype == torch.int8


@pytest.mark.parametrize("case", range(len(CASES)), ids=IDS)
def test_fake_kernel_shapes_match_the_real_outputs(case):
    name, args, kwargs, dynamic = CASES[case]
    real = _flat(getattr(ops, name)(*args, **kwargs))
    meta = _flat(getattr(ops, name)(*_map(args, lambda t: t.to("meta")),
                                    **_map(kwargs, lambda t: t.to("meta"))))
    assert len(meta) == len(real), name
    for r, m in zip(real, meta):
        assert m.device.type == "meta" and m.dtype == r.dtype, (name, m, r)
        if dynamic:  # an upper bound of the rows on meta tensors (an unbacked size under fake)
            assert m.shape[1:] == r.shape[1:] and m.shape[0] >= r.shape[0], name
        else:
            assert m.shape == r.shape, (name, m.shape, r.shape)


def test_gradients_are_the_backward_operators():
    x = torch.randn(5, 3, 16).requires_grad_()
    y = ops.npu_swiglu(x)
    g = torch.randn_like(y)
    y.backward(g)
    assert torch.equal(x.grad, torch.ops.megamoe.npu_swiglu_backward(g, x.detach(), -1))
    xr = x.detach().double().requires_grad_()
    a, b = xr.chunk(2, -1)
    (torch.nn.functional.silu(a) * b).backward(g.double())
    assert torch.allclose(x.grad.double(), xr.grad, rtol=1e-4, atol=1e-5)
    tokens = torch.randn(6, 8).requires_grad_()
    idx = torch.randint(0, 4, (6, 2), dtype=torch.int32)
    perm, si = ops.npu_moe_token_permute(tokens, idx)
    probs = torch.rand(6, 2, requires_grad=True)
    out = ops.npu_moe_token_unpermute(perm, si, probs=probs)
    gout = torch.randn_like(out)
    out.backward(gout)
    # out[t] = sum_k probs[t, k] tokens[t]
    t = tokens.detach()
    assert torch.allclose(tokens.grad, probs.detach().sum(1, keepdim=True) * gout, atol=1e-5)
    assert torch.allclose(probs.grad, (gout * t).sum(1, keepdim=True).expand(6, 2), atol=1e-4)


@pytest.mark.skipif(not (_library.HAS_AUTOGRAD and hasattr(torch.library, "opcheck")),
                    reason=f"torch {torch.__version__}: torch.library.opcheck needs torch >= 2.4 "
                           "(`make test-debian13` runs it on torch 2.6)")
@pytest.mark.parametrize("case", [i for i, c in enumerate(CASES) if not c[3]],
                         ids=[IDS[i] for i, c in enumerate(CASES) if not c[3]])
def test_opcheck(case):
    name, args, kwargs, _ = CASES[case]
    op = _entry(name)
    a = op._bind(args, kwargs)  # normalised as the entry point does (lists, dtype codes)
    pos, kw = op._split(a)
    if name in ("npu_swiglu", "npu_moe_token_permute", "npu_moe_token_unpermute"):
        pos = [_map(p, lambda t: t.requires_grad_() if t.is_floating_point() else t)
               for p in pos]
    torch.library.opcheck(op.op, tuple(pos), kw)


@pytest.mark.skipif(not (_library.HAS_AUTOGRAD and hasattr(torch.library, "opcheck")),
                    reason=f"torch {torch.__version__}: torch.library.opcheck needs torch >= 2.4 "
                           "(`make test-debian13` runs it on torch 2.6)")
def test_opcheck_backward_operators():
    """The operators the autograd formulas call are operators of their own: opcheck them too."""
    mm = torch.ops.megamoe
    x = torch.randn(5, 3, 16)
    torch.library.opcheck(mm.npu_swiglu_backward.default, (torch.randn(5, 3, 8), x, -1))
    tokens = torch.randn(6, 8)
    idx = torch.randint(0, 4, (6, 2), dtype=torch.int32)
    perm, si = ops.npu_moe_token_permute(tokens, idx)
    torch.library.opcheck(mm.moe_token_permute_backward.default, (torch.randn_like(perm), si, 6))
    probs = torch.rand(6, 2)
    torch.library.opcheck(mm.moe_token_unpermute_backward.default,
                          (perm, si, probs, torch.randn(6, 8)))
    torch.library.opcheck(mm.moe_token_unpermute_backward.default,
                          (perm, si, None, torch.randn(6, 8)))
