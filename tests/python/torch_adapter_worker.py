"""One rank of the torch.ops.megamoe checks: runs under `megamoe launch -n 2` (from the source
tree, or with a venv's python from an installed wheel; it imports only megamoe and torch).

usage: torch_adapter_worker.py OUT_PREFIX
TorchScript functions call torch.ops.megamoe.* directly (the C++ adapter's CPU kernels when it is
built for this torch, the Python bodies otherwise); every result must equal, bit for bit, the same
call through the Python body (ctypes). Then MegaMoeExperts forward/backward against a scripted
torch.ops.megamoe.experts_forward, and an argument error on both paths (the same status on
every rank, the next call works). Results: OUT_PREFIX.<rank>.json, a dict {check: "ok" | error
text} plus "backend" / "library" / "adapter" paths.
"""
import json
import os
import sys
import traceback
from typing import List, Optional

import torch

import megamoe
import megamoe.comm as mcomm
import megamoe.ops as ops
from megamoe import _adapter, _dtypes, _library
from megamoe.errors import MegaMoeError

RANK = int(os.environ["RANK"])
WORLD = int(os.environ["WORLD_SIZE"])
BS, H, K, E = 8, 32, 2, 4


@torch.jit.script
def scripted_dispatch(x: torch.Tensor, ids: torch.Tensor, scales: torch.Tensor, group: str,
                      world: int, rank: int, experts: int, quant_mode: int,
                      y_dtype: Optional[int]) -> List[torch.Tensor]:
    out = torch.ops.megamoe.npu_moe_distribute_dispatch_v2(
        x, ids, group, world, rank, experts, expert_scales=scales, quant_mode=quant_mode,
        y_dtype=y_dtype)
    return [out[0], out[1], out[2], out[3], out[4], out[5], out[6]]


@torch.jit.script
def scripted_round_trip(x: torch.Tensor, ids: torch.Tensor, scales: torch.Tensor, group: str,
                        world: int, rank: int, experts: int) -> torch.Tensor:
    d = torch.ops.megamoe.npu_moe_distribute_dispatch_v2(x, ids, group, world, rank, experts,
                                                         expert_scales=scales)
    return torch.ops.megamoe.npu_moe_distribute_combine_v2(d[0], ids, d[2], d[4], scales, group,
                                                           world, rank, experts)


@torch.jit.script
def scripted_experts_forward(layer: int, x: torch.Tensor, ids: torch.Tensor,
                             probs: torch.Tensor, gate_up: torch.Tensor,
                             down: torch.Tensor) -> torch.Tensor:
    out = torch.ops.megamoe.experts_forward(layer, x, ids, probs, None, gate_up, down, False,
                                            False)
    return out[0]


def inputs(seed):
    g = torch.Generator().manual_seed(seed * 10 + RANK)
    x = torch.randn(BS, H, generator=g).to(torch.bfloat16)
    ids = torch.stack([torch.randperm(E, generator=g)[:K] for _ in range(BS)]).int()
    scales = torch.rand(BS, K, generator=g)
    return x, ids, scales


def same(a, b, what):
    a, b = list(a), list(b)
    assert len(a) == len(b), f"{what}: {len(a)} vs {len(b)} outputs"
    for i, (u, v) in enumerate(zip(a, b)):
        assert u.dtype == v.dtype and u.shape == v.shape, \
            f"{what}[{i}]: {u.dtype}{tuple(u.shape)} vs {v.dtype}{tuple(v.shape)}"
        assert torch.equal(bits(u), bits(v)), f"{what}[{i}] differs"


def bits(t):
    """Bytes of floating tensors (bf16, fp8: equal bits, NaN included)."""
    return t.contiguous().view(torch.uint8) if t.dtype.is_floating_point and t.dim() else t


def check_dispatch(group):
    for seed, quant_mode, y in ((1, 0, None), (2, 2, None), (3, 2, megamoe.float8_e4m3fn)):
        x, ids, scales = inputs(seed)
        code = None if y is None else _dtypes.npu_code(y)
        got = scripted_dispatch(x, ids, scales, group, WORLD, RANK, E, quant_mode, code)
        want = ops.npu_moe_distribute_dispatch_v2.ctypes_path(
            x, ids, group, WORLD, RANK, E, expert_scales=scales, quant_mode=quant_mode, y_dtype=y)
        same(got, want, f"dispatch quant_mode={quant_mode} y_dtype={y}")


def check_performance_info(group):
    """performance_info accumulates in place on both paths, also through a strided view."""
    x, ids, scales = inputs(7)
    for fn in (ops.npu_moe_distribute_dispatch_v2, ops.npu_moe_distribute_dispatch_v2.ctypes_path):
        base = torch.full((2 * WORLD,), 5, dtype=torch.int64)
        fn(x, ids, group, WORLD, RANK, E, expert_scales=scales, performance_info=base[::2])
        assert bool((base[::2] >= 5).all()) and bool((base[1::2] == 5).all()), base.tolist()


def check_round_trip(group):
    x, ids, scales = inputs(4)
    got = scripted_round_trip(x, ids, scales, group, WORLD, RANK, E)
    d = ops.npu_moe_distribute_dispatch_v2.ctypes_path(x, ids, group, WORLD, RANK, E,
                                                       expert_scales=scales)
    want = ops.npu_moe_distribute_combine_v2.ctypes_path(d[0], ids, d[2], d[4], scales, group,
                                                         WORLD, RANK, E)
    same([got], [want], "dispatch+combine")


def check_add_rms_norm(group):
    x, ids, scales = inputs(5)
    d = ops.npu_moe_distribute_dispatch_v2(x, ids, group, WORLD, RANK, E, expert_scales=scales)
    g = torch.Generator().manual_seed(50 + RANK)
    residual = torch.randn(BS, 1, H, generator=g).to(torch.bfloat16)
    gamma = torch.rand(H, generator=g).to(torch.bfloat16)
    args = (d[0], ids, d[2], d[4], scales, residual, gamma, group, WORLD, RANK, E)
    same(ops.npu_moe_distribute_combine_add_rms_norm(*args),
         ops.npu_moe_distribute_combine_add_rms_norm.ctypes_path(*args), "combine_add_rms_norm")


def run_layer(layer, x, ids, probs):
    for p in layer.parameters():
        p.grad = None
    xg = x.clone().requires_grad_()
    pg = probs.clone().requires_grad_()
    out = layer(xg, ids, pg)
    out.float().square().sum().backward()
    return [out.detach(), xg.grad, pg.grad, layer.gate_up_weight.grad, layer.down_weight.grad]


def check_experts():
    torch.manual_seed(7)  # the same weights on every rank; each keeps its own experts
    layer = megamoe.MegaMoeExperts(128, 64, 32, E, K, ep_size=WORLD).to(torch.bfloat16)
    g = torch.Generator().manual_seed(70 + RANK)
    x = torch.randn(128, 64, generator=g).to(torch.bfloat16)
    ids = torch.stack([torch.randperm(E, generator=g)[:K] for _ in range(128)])
    probs = torch.rand(128, K, generator=g)
    first = run_layer(layer, x, ids, probs)
    again = run_layer(layer, x, ids, probs)  # the same layer and inputs: the same bits
    same(first, again, "MegaMoeExperts forward/backward")
    got = scripted_experts_forward(layer._op_id, x, ids, probs, layer.gate_up_weight.data,
                                   layer.down_weight.data)
    with torch.no_grad():
        same([got], [layer(x, ids, probs)], "scripted experts_forward")
    layer.close()


def check_error(group):
    x, ids, scales = inputs(6)
    bad = ids.clone()
    if RANK == 1:
        bad[0, 0] = E + 3  # an expert id out of range on one rank only
    try:
        scripted_dispatch(x, bad, scales, group, WORLD, RANK, E, 0, None)
        raise AssertionError("torch.ops accepted an out-of-range expert id")
    except RuntimeError as exc:  # TorchScript adds its traceback before the library's text
        # (torch 1.13's TorchScript drops the text of an error raised in a Python kernel, as the
        # in-place operators' composite is: the type and the every-rank failure still hold)
        # ("[megamoe INVALID_ARGUMENT -1] ..." from the adapter's kernel, "INVALID_ARGUMENT: ..."
        # from a Python body)
        text = "INVALID_ARGUMENT" in str(exc) and "out of range" in str(exc)
        assert text or _library.TORCH_VERSION < (2, 0), str(exc)[-300:]
    try:
        ops.npu_moe_distribute_dispatch_v2(x, bad, group, WORLD, RANK, E, expert_scales=scales)
        raise AssertionError("the wrapper accepted an out-of-range expert id")
    except MegaMoeError as exc:
        assert exc.name == "INVALID_ARGUMENT" and "expert" in str(exc), str(exc)[:300]
    check_dispatch(group)  # the operators still work


def main():
    prefix = sys.argv[1]
    res = {"backend": ops.npu_moe_distribute_dispatch_v2.backend, "library": megamoe.library_path,
           "adapter": _adapter.path}
    group = mcomm.group_name(None)
    for name, fn in (("dispatch", lambda: check_dispatch(group)),
                     ("round_trip", lambda: check_round_trip(group)),
                     ("performance_info", lambda: check_performance_info(group)),
                     ("add_rms_norm", lambda: check_add_rms_norm(group)),
                     ("experts", check_experts),
                     ("error", lambda: check_error(group))):
        try:
            fn()
            res[name] = "ok"
        except Exception:  # recorded for the test to show; the other ranks go on
            res[name] = traceback.format_exc()[-3000:]
    with open(f"{prefix}.{RANK}.json", "w") as f:
        json.dump(res, f)
    mcomm.shutdown()


if __name__ == "__main__":
    main()
