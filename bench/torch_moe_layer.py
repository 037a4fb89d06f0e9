"""Pure-PyTorch expert-parallel MoE layer: the baseline of `megamoe bench layer`.

One rank of an EP job started by `megamoe launch -n EP -- /usr/bin/python3 bench/torch_moe_layer.py`:
torch 1.13 bf16 matmuls per local expert, gloo all_to_all_single on uint8 views for dispatch
and combine (gloo cannot all-to-all bf16), autograd for the backward. The problem is built by
the same generator as bench/moe_data.c (splitmix64 per element), so both implementations see
bit-identical inputs. Rank 0 writes {"fwd_bwd_ms", "fwd_ms", "checksum"} as JSON to --out;
with --dump-dir every rank writes its first output (bf16 [T, H], raw) to
<dir>/torch_out<rank>.bin, which `megamoe bench layer` compares with megamoe's on every rank.

Where torch's bf16 matmul accumulates in bf16 (torch 1.13 below AVX-512; ~2-4 % error at these
sizes, megamoe/_torch_numerics.py) the bench's 1 % rule, made for fp32 accumulation, does not
hold for the timed path's output. There the dumped output is one more forward of the same layer
with fp32-accumulated matmuls (what torch computes with AVX-512), so the rule judges megamoe
against the computation it was made for; the timed iterations are unchanged, and rank 0 says on
stderr how far the timed path and megamoe each are from that output.
"""
import argparse
import json
import math
import os
import sys
import time

import numpy as np
import torch
import torch.distributed as dist

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
from megamoe import _torch_numerics  # noqa: E402

M64 = np.uint64(0xFFFFFFFFFFFFFFFF)


def mix(seed, stream, idx):
    """splitmix64 of (seed, stream, index), as mm_mix in bench/moe_data.c (uint64 wraps)."""
    with np.errstate(over="ignore"):
        z = (np.uint64(seed) * np.uint64(0x9E3779B97F4A7C15) +
             np.uint64(stream) * np.uint64(0xD1B54A32D192ED03) + idx.astype(np.uint64) +
             np.uint64(1))
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return z ^ (z >> np.uint64(31))


def unif(seed, stream, idx):
    z = mix(seed, stream, idx)
    return ((z >> np.uint64(11)).astype(np.float64) * 2.0 ** -53 * 2.0 - 1.0).astype(np.float32)


def bf16_tensor(n, scale, seed, stream, shape):
    u = unif(seed, stream, np.arange(n, dtype=np.uint64)) * np.float32(scale)
    return torch.from_numpy(u).bfloat16().reshape(shape)


def problem(ep, T, H, I, E, K, route, seed):
    n = ep * T
    hidden = bf16_tensor(n * H, 1.0, seed, 1, (n, H))
    grad = bf16_tensor(n * H, 1.0, seed, 2, (n, H))
    gate_up = bf16_tensor(E * H * 2 * I, math.sqrt(6.0 / (H + 2 * I)), seed, 3, (E, H, 2 * I))
    down = bf16_tensor(E * I * H, math.sqrt(6.0 / (I + H)), seed, 4, (E, I, H))
    if route != "balanced":
        raise SystemExit("torch_moe_layer.py: only --routing balanced is generated here")
    tok = np.arange(n, dtype=np.int64)
    stride = max(E // K, 1)
    ids = np.stack([(tok + k * stride) % E for k in range(K)], 1).astype(np.int64)
    logits = np.stack([unif(seed, 200 + k, tok.astype(np.uint64)).astype(np.float64)
                       for k in range(K)], 1)
    ex = np.exp(logits)
    probs = (ex / ex.sum(1, keepdims=True)).astype(np.float32)
    return hidden, grad, gate_up, down, torch.from_numpy(ids), torch.from_numpy(probs)


class AllToAll(torch.autograd.Function):
    """all_to_all_single of bf16 rows through a uint8 view; backward = the reverse exchange."""

    @staticmethod
    def forward(ctx, x, send_rows, recv_rows):
        ctx.send_rows, ctx.recv_rows = send_rows, recv_rows
        return _a2a(x, send_rows, recv_rows)

    @staticmethod
    def backward(ctx, g):
        return _a2a(g.contiguous(), ctx.recv_rows, ctx.send_rows), None, None


def _a2a(x, send_rows, recv_rows):
    out = torch.empty(sum(recv_rows), x.shape[1], dtype=x.dtype)
    # the uint8 view is [rows, 2H]: split sizes stay in rows
    dist.all_to_all_single(out.view(torch.uint8), x.contiguous().view(torch.uint8),
                           list(recv_rows), list(send_rows))
    return out


def moe_forward(x, ids, probs, w1, w2, ep, rank, E, K, mm=torch.matmul):
    """x [T,H] bf16, ids/probs [T,K]; w1 [L,H,2I], w2 [L,I,H] local experts (bf16); mm: the
    experts' matmul."""
    T, H = x.shape
    L = E // ep
    I = w2.shape[1]
    flat = ids.reshape(-1)
    order = torch.argsort(flat, stable=True)           # slots sorted by expert
    counts = torch.bincount(flat, minlength=E)          # [E] local histogram
    all_counts = [torch.empty_like(counts) for _ in range(ep)]
    dist.all_gather(all_counts, counts)                 # counts[s][e]
    all_counts = torch.stack(all_counts)
    send_rows = [int(counts[d * L:(d + 1) * L].sum()) for d in range(ep)]
    recv_rows = [int(all_counts[s, rank * L:(rank + 1) * L].sum()) for s in range(ep)]
    xs = x[order // K]                                  # permuted token rows
    recv = AllToAll.apply(xs, send_rows, recv_rows)     # source-major, expert-sorted per source
    # rows of local expert j: from each source s, a contiguous block
    blocks = []
    for s in range(ep):
        base = sum(recv_rows[:s])
        o = 0
        for j in range(L):
            c = int(all_counts[s, rank * L + j])
            blocks.append((j, base + o, c))
            o += c
    parts = [None] * len(blocks)
    for j in range(L):
        idx = [(bi, st, c) for bi, (jj, st, c) in enumerate(blocks) if jj == j and c > 0]
        if not idx:
            continue
        xe = torch.cat([recv[st:st + c] for _, st, c in idx])
        h = mm(xe, w1[j])
        a = torch.nn.functional.silu(h[:, :I]) * h[:, I:]
        ye = mm(a, w2[j])
        o = 0
        for bi, st, c in idx:
            parts[bi] = (st, ye[o:o + c])
            o += c
    pieces = [p for p in parts if p is not None]
    pieces.sort(key=lambda p: p[0])
    y = torch.cat([p[1] for p in pieces]) if pieces else recv[:0]
    back = AllToAll.apply(y, recv_rows, send_rows)      # back in this rank's permuted order
    out_slots = torch.empty_like(back)
    out_slots = out_slots.index_copy(0, order, back)    # slot order [T*K, H]
    out = (out_slots.float().reshape(T, K, H) * probs.unsqueeze(-1)).sum(1)
    return out.bfloat16()


def rel_l2(x, ref):
    x, ref = x.float(), ref.float()
    return float((x - ref).norm() / max(float(ref.norm()), 1e-30))


def dump_output(d, first, x, ids, probs, w1, w2, ep, rank, E, K):
    """Writes the output `megamoe bench layer` compares with megamoe's: the timed path's first
    one, or where torch accumulates bf16 matmuls in bf16 the fp32-accumulated forward's."""
    inexact = torch.tensor(float(_torch_numerics.torch_bf16_accumulates_in_bf16()))
    dist.all_reduce(inexact, op=dist.ReduceOp.MAX)  # every rank takes the same collectives
    out = first
    if inexact.item():
        with torch.no_grad():
            out = moe_forward(x, ids, probs, w1, w2, ep, rank, E, K,
                              mm=_torch_numerics.matmul_fp32_acc)
        T, H = out.shape
        mp = os.path.join(d, f"megamoe_out{rank}.bin")
        dists = torch.tensor([rel_l2(first, out), -1.0])
        if os.path.exists(mp):
            mega = torch.from_numpy(np.fromfile(mp, dtype=np.int16)).view(torch.bfloat16)
            dists[1] = rel_l2(mega.reshape(T, H), out)
        dist.all_reduce(dists, op=dist.ReduceOp.MAX)
        if rank == 0:
            print(f"torch_moe_layer.py: torch_bf16_accumulates_in_bf16: true (probe relative "
                  f"error {_torch_numerics.bf16_matmul_error():.3g} at K="
                  f"{_torch_numerics.PROBE_K}); compared with megamoe: this layer with "
                  f"fp32-accumulated matmuls (torch's AVX-512 numerics); from it, relative L2 "
                  f"(worst rank): torch's timed bf16 path {dists[0]:.3g}, megamoe "
                  f"{dists[1]:.3g}", file=sys.stderr, flush=True)
    out.contiguous().view(torch.int16).numpy().tofile(os.path.join(d, f"torch_out{rank}.bin"))


def main():
    ap = argparse.ArgumentParser()
    for name, default in (("tokens", 1024), ("hidden", 512), ("intermediate", 128),
                          ("experts", 4), ("top-k", 2), ("seed", 1), ("iters", 3),
                          ("warmup", 1), ("threads", 1)):
        ap.add_argument("--" + name, type=int, default=default)
    ap.add_argument("--routing", default="balanced")
    ap.add_argument("--out", default="")
    ap.add_argument("--dump-dir", default="")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    dist.init_process_group("gloo")
    rank, ep = dist.get_rank(), dist.get_world_size()
    T, H, I, E, K = a.tokens, a.hidden, a.intermediate, a.experts, a.top_k
    L = E // ep
    hidden, grad, gate_up, down, ids, probs = problem(ep, T, H, I, E, K, a.routing, a.seed)
    sl = slice(rank * T, (rank + 1) * T)
    w1 = gate_up[rank * L:(rank + 1) * L].clone().requires_grad_()
    w2 = down[rank * L:(rank + 1) * L].clone().requires_grad_()
    times, fwd_times, checksum = [], [], 0.0
    for it in range(a.warmup + a.iters):
        x = hidden[sl].clone().requires_grad_()
        p = probs[sl].clone().requires_grad_()
        w1.grad = w2.grad = None
        dist.barrier()
        t0 = time.perf_counter()
        out = moe_forward(x, ids[sl], p, w1, w2, ep, rank, E, K)
        t1 = time.perf_counter()
        out.backward(grad[sl])
        t2 = time.perf_counter()
        if it >= a.warmup:
            times.append(t2 - t0)
            fwd_times.append(t1 - t0)
        if it == 0:
            checksum = float(out.double().sum())
            first = out.detach()
    if a.dump_dir:
        dump_output(a.dump_dir, first, hidden[sl], ids[sl], probs[sl], w1, w2, ep, rank, E, K)
    # the job is as slow as its slowest rank
    t = torch.tensor([float(np.median(times)), float(np.median(fwd_times))])
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    if rank == 0 and a.out:
        with open(a.out, "w") as f:
            json.dump({"fwd_bwd_ms": t[0].item() * 1e3, "fwd_ms": t[1].item() * 1e3,
                       "checksum": checksum, "threads": a.threads}, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
