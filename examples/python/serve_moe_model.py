"""Serve the MoE layers of a small model with megamoe's `mega_moe` (CANN's API, on CPUs).

    build/release/bin/megamoe launch -n 2 -- /usr/bin/python3 examples/python/serve_moe_model.py

A toy decoder (embedding, N blocks of RMSNorm + MoE FFN with a router, top-k experts and one
shared expert, then the LM head) is served expert-parallel the way vLLM-Ascend's fused-MC2 path
does it: each rank holds num_experts / W experts of every layer, all layers share ONE symmetric
buffer, layers alternate between bf16 and W8A8 weights (the buffer's quantisation attributes
are re-assigned before each layer's call), and every rank serves its own requests — a prefill
of its prompts, then decode steps whose batch size changes as requests finish (a rank with no
request left still joins each call with 0 tokens). Every step is checked against the same model
computed in plain torch on the full weights; the script prints the greedy tokens it generated.
"""
import math
import os
import sys

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))
import megamoe.comm  # noqa: E402
import megamoe.ops as ops  # noqa: E402

VOCAB, H, I, E, K, LAYERS, MAX_TOKENS = 256, 128, 64, 8, 2, 4, 32


def rms_norm(x, eps=1e-6):
    x32 = x.float()
    return (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)


class ToyMoEModel:
    """Weights of the whole model (every rank builds the same ones from one seed)."""

    def __init__(self, seed=0):
        g = torch.Generator().manual_seed(seed)
        self.embed = (torch.randn(VOCAB, H, generator=g) * 0.5).to(torch.bfloat16)
        self.head = (torch.randn(H, VOCAB, generator=g) / math.sqrt(H)).to(torch.bfloat16)
        self.layers = []
        for i in range(LAYERS):
            w13 = torch.randn(E, H, 2 * I, generator=g) / math.sqrt(H)   # [in, out], gate | up
            w2 = torch.randn(E, I, H, generator=g) / math.sqrt(I)
            layer = {"router": torch.randn(H, E, generator=g) / math.sqrt(H),
                     "shared13": (torch.randn(H, 2 * I, generator=g) / math.sqrt(H)).to(torch.bfloat16),
                     "shared2": (torch.randn(I, H, generator=g) / math.sqrt(I)).to(torch.bfloat16),
                     "int8": i % 2 == 1}
            if layer["int8"]:  # W8A8: per-output-channel int8 weights (vLLM's layout)
                s13 = w13.abs().amax(1) / 127
                s2 = w2.abs().amax(1) / 127
                layer["w13"] = torch.round(w13 / s13[:, None]).clamp(-127, 127).to(torch.int8)
                layer["w2"] = torch.round(w2 / s2[:, None]).clamp(-127, 127).to(torch.int8)
                layer["s13"], layer["s2"] = s13, s2
            else:
                layer["w13"], layer["w2"] = w13.to(torch.bfloat16), w2.to(torch.bfloat16)
            self.layers.append(layer)

    @staticmethod
    def route(layer, h):
        probs = torch.softmax(h.float() @ layer["router"], dim=-1)
        w, ids = torch.topk(probs, K, dim=-1)
        return ids.int(), (w / w.sum(-1, keepdim=True)).float()

    @staticmethod
    def torch_moe(layer, h, ids, w):
        """The MoE FFN in plain torch (what the fused call must equal)."""
        def ffn(x, w13, w2, s13=None, s2=None):
            if s13 is None:
                a = x.float() @ w13.float()
            else:  # W8A8: per-token int8 activations, as the operator does
                sx = x.float().abs().amax(-1, keepdim=True) / 127
                q = torch.where(sx > 0, torch.round(x.float() / torch.where(sx > 0, sx, 1)), 0)
                a = (q @ w13.float()) * s13 * sx
            g, u = a[:, :I], a[:, I:]
            a = torch.nn.functional.silu(g) * u
            if s2 is None:
                return a.to(torch.bfloat16).float() @ w2.float()
            sa = a.abs().amax(-1, keepdim=True) / 127
            qa = torch.where(sa > 0, torch.round(a / torch.where(sa > 0, sa, 1)), 0)
            return (qa @ w2.float()) * s2 * sa
        out = torch.zeros(h.shape[0], H)
        for t in range(h.shape[0]):
            for k in range(K):
                e = int(ids[t, k])
                args = (layer["w13"][e], layer["w2"][e])
                if layer["int8"]:
                    args += (layer["s13"][e], layer["s2"][e])
                out[t] += w[t, k] * ffn(h[t:t + 1], *args)[0]
        out += ffn(h, layer["shared13"], layer["shared2"])
        return out.to(torch.bfloat16)


def main():
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    model = ToyMoEModel()
    L = E // world
    mine = slice(rank * L, (rank + 1) * L)
    # one buffer for every layer; the shape key is the model's, not the layer's quantisation
    buf = ops.get_symm_buffer_for_mega_moe(dist.group.WORLD, E, MAX_TOKENS, K, hidden=H,
                                           intermediate_hidden=2 * I)

    def serve_layer(layer, h):
        ids, w = model.route(layer, rms_norm(h))
        kw = {}
        if layer["int8"]:
            buf.dispatch_quant_mode, buf.dispatch_quant_out_dtype = 2, torch.int8
            kw = {"l1_weights_sf": [layer["s13"][mine]], "l2_weights_sf": [layer["s2"][mine]]}
        else:
            buf.dispatch_quant_mode, buf.dispatch_quant_out_dtype = 0, None
        y, _ = ops.mega_moe(rms_norm(h), ids, w, [layer["w13"][mine]], [layer["w2"][mine]], buf,
                            shared_l1_weights=[layer["shared13"]],
                            shared_l2_weights=[layer["shared2"]], **kw)
        want = model.torch_moe(layer, rms_norm(h), ids, w)
        if h.shape[0]:
            err = (y.float() - want.float()).norm() / want.float().norm()
            assert err < 0.02, f"rank {rank}: layer differs from plain torch by {err:.4f}"
        return h + y

    def forward(tokens):
        h = model.embed[tokens]
        for layer in model.layers:
            h = serve_layer(layer, h)
        return (rms_norm(h).float() @ model.head.float()).argmax(-1)

    # each rank serves its own requests: prompts of different lengths, different counts
    g = torch.Generator().manual_seed(100 + rank)
    requests = [torch.randint(0, VOCAB, (int(n),), generator=g) for n in (3 + rank, 5, 2)[:2 + rank % 2]]
    budgets = [4 + 2 * i + rank for i in range(len(requests))]   # tokens to generate each
    prompt = torch.cat(requests)
    last = forward(prompt)                                        # prefill: every prompt token
    ends = torch.cumsum(torch.tensor([len(r) for r in requests]), 0) - 1
    cur = last[ends]
    generated = [[int(t)] for t in cur]
    steps = 12  # the same on every rank (collective calls); the last ones serve 0 tokens
    for step in range(steps):                                     # decode: batch shrinks to 0
        live = [i for i in range(len(requests)) if len(generated[i]) < budgets[i]]
        nxt = forward(torch.tensor([generated[i][-1] for i in live], dtype=torch.long))
        for j, i in enumerate(live):
            generated[i].append(int(nxt[j]))
    buf.destroy()
    print(f"rank {rank}: served {len(requests)} requests over {steps + 1} calls per layer "
          f"(bf16 and W8A8 layers, one buffer), every layer matched plain torch; generated "
          f"{[g[:6] for g in generated]}", flush=True)
    megamoe.comm.shutdown()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
