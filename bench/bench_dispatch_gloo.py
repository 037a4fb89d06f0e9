"""The gloo baseline of `megamoe bench dispatch`: the same dispatch + combine exchange built on
torch.distributed all_to_all_single (gloo, TCP loopback), 2 ranks under `megamoe launch -n 2`.

Same workload as bench_dispatch.c (routing from the same splitmix64 stream, H = 7168, K = 8,
E = 64, bf16 tokens; quant_mode 2 = int8 per token + fp32 scale): counts exchange, pack rows by
destination (local expert, token), all_to_all_single on a uint8 view (gloo rejects bf16), unpack
into expand_x's (expert, source, token) layout with zeroed tail; combine packs the expert rows by
source, exchanges them back and sums w * y per token. Appends "gloo bs quant 1 dispatch_us
combine_us payload_bytes" lines to --out (rank 0).
"""
import argparse
import os
import time

import torch
import torch.distributed as dist

H, K, E, W = 7168, 8, 64, 2
L = E // W
M64 = (1 << 64) - 1


def sm64(state):
    state[0] = (state[0] + 0x9E3779B97F4A7C15) & M64
    z = state[0]
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
    return z ^ (z >> 31)


def routing(rank, bs):
    ids = torch.empty(bs, K, dtype=torch.int64)
    for t in range(bs):
        s = [rank * 1000003 + t]
        perm = list(range(E))
        for i in range(K):
            j = i + sm64(s) % (E - i)
            perm[i], perm[j] = perm[j], perm[i]
        ids[t] = torch.tensor(perm[:K])
    w = (1.0 / (torch.arange(K, dtype=torch.float32) + 2)).expand(bs, K).contiguous()
    return ids, w


def fill(n, seed):
    """The bench's bf16 pattern, built in chunks (an int64 index of n elements would not fit)."""
    out = torch.empty(n, dtype=torch.bfloat16)
    step = 1 << 24
    for a in range(0, n, step):
        i = torch.arange(a, min(n, a + step), dtype=torch.int64)
        out[a:a + step] = (((i * 31 + seed * 7) % 97).float() / 97 - 0.5).to(torch.bfloat16)
    return out


def a2a_bytes(send, send_rows, recv_rows, row_bytes):
    """all_to_all_single of a [rows, row_bytes] uint8 tensor with per-rank row counts."""
    out = torch.empty(sum(recv_rows), row_bytes, dtype=torch.uint8)
    dist.all_to_all_single(out, send, [r for r in recv_rows], [s for s in send_rows])
    return out


class Case:
    def __init__(self, rank, bs, quant):
        self.bs, self.quant = bs, quant
        self.ids, self.w = routing(rank, bs)
        self.x = fill(bs * H, rank).view(bs, H)
        self.A = bs * W * min(L, K)
        self.expand = torch.zeros(self.A, H, dtype=torch.int8 if quant else torch.bfloat16)
        self.scales = torch.zeros(self.A)
        self.assist = torch.zeros(self.A * 128, dtype=torch.int32)

    def dispatch(self):
        bs, ids = self.bs, self.ids
        flat = ids.reshape(-1)
        dst, le = flat // L, flat % L
        key = (dst * L + le) * (bs * K) + torch.arange(bs * K)
        order = torch.argsort(key)
        cnt = torch.bincount(dst * L + le, minlength=W * L)
        rcnt = torch.empty_like(cnt)
        dist.all_to_all_single(rcnt, cnt)
        send_rows = cnt.view(W, L).sum(1).tolist()
        recv_rows = rcnt.view(W, L).sum(1).tolist()
        tok = order // K
        if self.quant:
            xf = self.x.float()
            amax = xf.abs().amax(1).clamp_min(1e-30)
            q = torch.round(xf * (127.0 / amax)[:, None]).clamp(-128, 127).to(torch.int8)
            payload = q[tok].view(torch.uint8)
            sc = (amax / 127.0)[tok]
        else:
            payload = self.x[tok].view(torch.uint8)
            sc = torch.zeros(bs * K)
        meta = torch.stack([tok, order % K], 1).to(torch.int32)
        rows = a2a_bytes(payload, send_rows, recv_rows, payload.shape[1])
        rsc = a2a_bytes(sc.view(-1, 1).view(torch.uint8), send_rows, recv_rows, 4).view(torch.float32)
        rmeta = a2a_bytes(meta.view(torch.uint8), send_rows, recv_rows, 8).view(torch.int32)
        # received [source][local expert][token] -> expand_x [local expert][source][token]
        rc = rcnt.view(W, L)
        src_start = torch.cumsum(rc.sum(1), 0) - rc.sum(1)
        within = torch.cumsum(rc, 1) - rc
        dst_start = (torch.cumsum(rc.t().reshape(-1), 0) - rc.t().reshape(-1)).view(L, W).t()
        idx = torch.empty(rc.sum().item(), dtype=torch.int64)
        src_of = torch.empty_like(idx)
        for s in range(W):
            for e in range(L):
                n = int(rc[s, e])
                if n:
                    a = int(src_start[s] + within[s, e])
                    idx[a:a + n] = torch.arange(int(dst_start[s, e]), int(dst_start[s, e]) + n)
                    src_of[a:a + n] = s
        n = idx.numel()
        self.expand.view(torch.uint8).view(self.A, -1).index_copy_(0, idx, rows)
        self.scales.index_copy_(0, idx, rsc.view(-1))
        trip = torch.stack([src_of.to(torch.int32), rmeta[:, 0], rmeta[:, 1]], 1)
        self.assist[:3 * n].view(n, 3).index_copy_(0, idx, trip)
        self.expand[n:].zero_()
        self.scales[n:].zero_()
        self.assist[3 * n:].zero_()
        self.plan = (order, send_rows, recv_rows, idx)
        return n

    def combine(self, expert_out):
        order, send_rows, recv_rows, idx = self.plan
        back = expert_out[idx].view(torch.uint8)  # rows grouped by source again
        got = a2a_bytes(back, recv_rows, send_rows, H * 2).view(torch.bfloat16)
        wpair = self.w.reshape(-1)[order]
        tok = order // K
        out = torch.zeros(self.bs, H)
        for a in range(0, got.shape[0], 4096):  # fp32 copies in pieces, not of every row at once
            out.index_add_(0, tok[a:a + 4096], got[a:a + 4096].float() * wpair[a:a + 4096, None])
        return out.to(torch.bfloat16)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--bs", default="128,4096")
    p.add_argument("--quant", default="0,2")
    p.add_argument("--out", required=True)
    a = p.parse_args()
    rank = int(os.environ["RANK"])
    dist.init_process_group("gloo", rank=rank, world_size=int(os.environ["WORLD_SIZE"]))
    torch.set_num_threads(1)
    for bs in [int(b) for b in a.bs.split(",")]:
        for q in [int(c) for c in a.quant.split(",") if c in "02"]:
            c = Case(rank, bs, q)
            eo = fill(c.A * H, 3).view(c.A, H)
            reps = 8 if bs <= 512 else 3
            td, tc = [], []
            for r in range(reps + 1):
                dist.barrier()
                t0 = time.perf_counter()
                n = c.dispatch()
                t1 = time.perf_counter()
                dist.barrier()
                t2 = time.perf_counter()
                c.combine(eo if q else c.expand)
                t3 = time.perf_counter()
                if r:
                    td.append((t1 - t0) * 1e6)
                    tc.append((t3 - t2) * 1e6)
            td.sort()
            tc.sort()
            if rank == 0:
                row = H * (1 if q else 2) + (4 if q else 0)
                with open(a.out, "a") as f:
                    f.write(f"gloo {bs} {q} 1 {td[len(td) // 2]:.3f} {tc[len(tc) // 2]:.3f} "
                            f"{n * row + n * H * 2}\n")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
