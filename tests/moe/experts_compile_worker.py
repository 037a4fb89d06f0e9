"""One rank of the torch.compile check of MegaMoeExperts (tests/moe/test_experts_compile.py):
a model that is the layer plus a sum loss, trained 3 AdamW steps eagerly and compiled with
fullgraph=True on each backend; the parameters and the input gradients of every step must be
bit-identical. The layer compiled alone under torch.no_grad() must equal the eager one too.

usage: experts_compile_worker.py BACKEND...     (under `megamoe launch -n 2`, torch >= 2.4)
Prints "rank R backend B: ok" per backend.
"""
import os
import sys

import torch

import megamoe

RANK = int(os.environ["RANK"])
WORLD = int(os.environ["WORLD_SIZE"])
T, H, I, E, K = 128, 64, 32, 4, 2
STEPS = 3


class Model(torch.nn.Module):
    """The layer plus a sum loss."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)  # the same initialisation on every rank (each keeps its experts)
        self.experts = megamoe.MegaMoeExperts(T, H, I, E, K, ep_size=WORLD).to(torch.bfloat16)

    def forward(self, x, ids, probs):
        return self.experts(x, ids, probs).float().sum()


def inputs(step):
    g = torch.Generator().manual_seed(1000 * step + RANK)
    x = torch.randn(T, H, generator=g).to(torch.bfloat16).requires_grad_()
    ids = torch.stack([torch.randperm(E, generator=g)[:K] for _ in range(T)]).int()
    probs = torch.rand(T, K, generator=g).requires_grad_()
    return x, ids, probs


def train(backend):
    model = Model()
    run = model if backend == "eager" else torch.compile(model, backend=backend, fullgraph=True)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    record = []
    for step in range(STEPS):
        x, ids, probs = inputs(step)
        loss = run(x, ids, probs)
        loss.backward()
        opt.step()
        opt.zero_grad()
        record += [x.grad, probs.grad]
    # inference: the layer alone compiled under no_grad (the loss is not compared: inductor may
    # sum in another order; what must be identical is the layer, its gradients, the parameters)
    layer = model.experts if backend == "eager" else torch.compile(model.experts, backend=backend,
                                                                   fullgraph=True)
    with torch.no_grad():
        x, ids, probs = inputs(STEPS)
        record.append(layer(x.detach(), ids, probs.detach()))
    record += [p.detach().clone() for p in model.parameters()]
    model.experts.close()
    return record


def bits(t):
    return t.contiguous().view(torch.uint8) if t.dtype.is_floating_point and t.dim() else t


def main():
    want = train("eager")
    for backend in sys.argv[1:]:
        torch._dynamo.reset()
        got = train(backend)
        for i, (a, b) in enumerate(zip(want, got)):
            assert a.dtype == b.dtype and a.shape == b.shape, f"{backend}: record {i}"
            if not torch.equal(bits(a), bits(b)):
                raise AssertionError(f"{backend}: record {i} differs from eager "
                                     f"(max |diff| {(a.float() - b.float()).abs().max().item()})")
        print(f"rank {RANK} backend {backend}: ok", flush=True)
    megamoe.comm.shutdown()


if __name__ == "__main__":
    main()
