"""A: a common expert-parallel experts layer in plain PyTorch (the baseline of benchmark.py).

What most PyTorch MoE code does when it has no fused kernel: sort the token slots by expert
(permute), exchange the per-expert counts and then the rows with ``all_to_all`` over the process
group, run one GEMM chain per local expert in torch, send the results back with a second
``all_to_all`` and reduce each token's K rows with its router weights (unpermute). Autograd does
the backward (the exchanges are autograd Functions that run the reverse exchange).

It has MegaMoeExperts' call signature (``hidden_states, topk_ids, topk_weights,
tokens_per_expert=None``) and math (SwiGLU experts, router weights applied in fp32 when the K rows
are summed), so it drops into the same model. Its weights use the ``nn.Linear`` layout common
checkpoints have: ``w13 [E/EP, 2I, H]`` (gate rows, then up rows) and ``w2 [E/EP, H, I]``;
:meth:`copy_from_mega` fills them from a MegaMoeExperts shard with ``megamoe.layout``.
"""
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from megamoe import layout


def _all_to_all_rows(x, send_rows, recv_rows, group):
    """Rows of ``x`` [sum(send_rows), H] to the ranks; returns [sum(recv_rows), H].

    gloo cannot all-to-all bfloat16, so the rows travel as bytes (a [rows, 2H] uint8 view keeps
    the split sizes in rows)."""
    out = torch.empty(sum(recv_rows), x.shape[1], dtype=x.dtype)
    dist.all_to_all_single(out.view(torch.uint8), x.contiguous().view(torch.uint8),
                           list(recv_rows), list(send_rows), group=group)
    return out


class _AllToAll(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, send_rows, recv_rows, group):
        ctx.send_rows, ctx.recv_rows, ctx.group = send_rows, recv_rows, group
        return _all_to_all_rows(x, send_rows, recv_rows, group)

    @staticmethod
    def backward(ctx, grad):
        return _all_to_all_rows(grad, ctx.recv_rows, ctx.send_rows, ctx.group), None, None, None


class _PermuteRows(torch.autograd.Function):
    """x[src] whose backward sums the K copies of each token row in fp32 and rounds once (what
    fused permute kernels do; torch's own indexing backward would add them in bfloat16)."""

    @staticmethod
    def forward(ctx, x, src):
        ctx.save_for_backward(src)
        ctx.rows = x.shape[0]
        return x.index_select(0, src)

    @staticmethod
    def backward(ctx, grad):
        (src,) = ctx.saved_tensors
        acc = torch.zeros(ctx.rows, grad.shape[1], dtype=torch.float32)
        acc.index_add_(0, src, grad.float())
        return acc.to(grad.dtype), None


class CommonEPExperts(nn.Module):
    """Experts ``rank*E/EP .. (rank+1)*E/EP-1`` of an EP group, in plain torch (see module doc)."""

    def __init__(self, hidden_size, intermediate_size, num_experts, top_k, ep_size=1,
                 ep_group=None):
        super().__init__()
        if num_experts % ep_size:
            raise ValueError(f"num_experts ({num_experts}) must be divisible by ep_size "
                             f"({ep_size})")
        self.hidden_size, self.intermediate_size = hidden_size, intermediate_size
        self.num_experts, self.top_k, self.ep_size = num_experts, top_k, ep_size
        self.ep_group = ep_group
        self.local_experts = num_experts // ep_size
        self.w13 = nn.Parameter(torch.empty(self.local_experts, 2 * intermediate_size, hidden_size))
        self.w2 = nn.Parameter(torch.empty(self.local_experts, hidden_size, intermediate_size))
        for e in range(self.local_experts):
            nn.init.xavier_uniform_(self.w13.data[e])
            nn.init.xavier_uniform_(self.w2.data[e])

    @torch.no_grad()
    def copy_from_mega(self, mega):
        """Take the weights of a MegaMoeExperts shard (gate_up [L, H, 2I], down [L, I, H])."""
        gate, up = layout.gate_up_to_linear(mega.gate_up_weight.detach())
        self.w13.copy_(torch.cat((gate, up), dim=1))
        self.w2.copy_(layout.down_to_linear(mega.down_weight.detach()))

    def to_mega_layout(self, w13, w2):
        """(gate_up [L, H, 2I], down [L, I, H]), the MegaMoeExperts layout, of tensors shaped
        like w13 and w2 (the weights, their gradients, fp32 master copies), so the two layers
        can be compared tensor by tensor."""
        i = self.intermediate_size
        w13, w2 = w13.detach(), w2.detach()
        return layout.gate_up_from_linear(w13[:, :i], w13[:, i:]), layout.down_from_linear(w2)

    def forward(self, hidden_states, topk_ids, topk_weights, tokens_per_expert=None):
        shape = hidden_states.shape
        x = hidden_states.reshape(-1, self.hidden_size)
        t, k, ep, nl = x.shape[0], self.top_k, self.ep_size, self.local_experts
        flat = topk_ids.reshape(-1).long()
        if tokens_per_expert is None:
            tokens_per_expert = torch.bincount(flat, minlength=self.num_experts)
        # permute: slot t*K+k sorted by expert (stable), so rows for rank d / expert j are a block
        order = torch.argsort(flat, stable=True)
        permuted = _PermuteRows.apply(x, order // k)
        send_counts = tokens_per_expert.reshape(ep, nl).long()
        if ep > 1:
            recv_counts = torch.empty_like(send_counts)
            dist.all_to_all_single(recv_counts, send_counts, group=self.ep_group)
        else:
            recv_counts = send_counts
        send_rows = send_counts.sum(1).tolist()
        recv_rows = recv_counts.sum(1).tolist()
        recv = _AllToAll.apply(permuted, send_rows, recv_rows, self.ep_group) if ep > 1 \
            else permuted
        # received rows are source-major, expert-sorted within a source: gather each local
        # expert's rows from every source, run its GEMMs, and put the results back in place
        counts = recv_counts.tolist()
        starts, pos = [], 0
        for s in range(ep):
            row = []
            for j in range(nl):
                row.append(pos)
                pos += counts[s][j]
            starts.append(row)
        w13, w2 = self.w13.unbind(0), self.w2.unbind(0)
        outs, index = [], []
        for j in range(nl):
            idx = [torch.arange(starts[s][j], starts[s][j] + counts[s][j]) for s in range(ep)
                   if counts[s][j]]
            if not idx:
                continue
            idx = torch.cat(idx)
            h = F.linear(recv[idx], w13[j])
            gate, up = h.float().chunk(2, dim=-1)
            act = (F.silu(gate) * up).to(h.dtype)  # fp32 math, one rounding to bf16
            outs.append(F.linear(act, w2[j]))
            index.append(idx)
        if outs:
            y = torch.cat(outs)[torch.argsort(torch.cat(index))]
        else:
            y = recv[:0]
        back = _AllToAll.apply(y, recv_rows, send_rows, self.ep_group) if ep > 1 else y
        slots = back[torch.argsort(order)]  # unpermute: back to slot order t*K+k
        out = (slots.float().view(t, k, -1) * topk_weights.float().unsqueeze(-1)).sum(1)
        return out.to(x.dtype).reshape(shape)

    def close(self):
        """Nothing to release (MegaMoeExperts' lifecycle call, for drop-in use)."""

    def extra_repr(self):
        return (f"H={self.hidden_size}, I={self.intermediate_size}, E={self.num_experts}, "
                f"K={self.top_k}, ep_size={self.ep_size}")
