"""The optimizer step both scripts use: AdamW on fp32 master weights of a bfloat16 model,
dense gradients averaged over the ranks, expert gradients kept on their owner; a timer for the
routed-experts call inside the step; per-rank checkpoints; process-group setup.
"""
import argparse
import math
import os
import socket
import sys
import time

import torch
import torch.distributed as dist

HERE = os.path.dirname(os.path.abspath(__file__))
try:
    import megamoe  # noqa: F401
except ImportError:  # run from a source checkout without PYTHONPATH=python
    sys.path.insert(0, os.path.join(HERE, "..", "..", "python"))
    import megamoe  # noqa: F401
sys.path.insert(0, HERE)
from common_experts import CommonEPExperts  # noqa: E402
from model import QwenMoeConfig, QwenMoeModel  # noqa: E402


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def init_distributed(threads=0):
    """gloo process group from the launcher's env (torchrun or `megamoe launch`), or a
    one-rank group when started without a launcher; torch gets this rank's share of the cores
    (MegaMoeExperts takes the same share for its workers)."""
    if "RANK" not in os.environ:  # plain `python3 train.py`: EP 1
        os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_WORLD_SIZE="1",
                          MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()))
        os.environ.setdefault("HYPER_PARALLEL_SHMEM_BOOTSTRAP_ENDPOINT",
                              f"tcp://127.0.0.1:{_free_port()}")
    if not dist.is_initialized():
        dist.init_process_group("gloo")
    if threads <= 0:
        local = int(os.environ.get("LOCAL_WORLD_SIZE", dist.get_world_size()))
        threads = max(1, (os.cpu_count() or 1) // max(1, local))
    torch.set_num_threads(threads)
    return dist.get_rank(), dist.get_world_size(), threads


def _capacity(value):
    if value.lower() == "none":
        return None
    f = float(value)
    if not math.isfinite(f) or f < 1:
        raise argparse.ArgumentTypeError(f"capacity factor must be 'none' or >= 1, got {value}")
    return f


_INT_FLAGS = (("vocab", "vocab_size"), ("hidden", "hidden_size"), ("layers", "num_layers"),
              ("heads", "num_attention_heads"), ("kv-heads", "num_key_value_heads"),
              ("seq-len", "seq_len"), ("batch", "batch_size"), ("experts", "num_experts"),
              ("top-k", "top_k"), ("intermediate", "intermediate_size"),
              ("shared-intermediate", "shared_expert_intermediate_size"))
_FLOAT_FLAGS = (("rope-theta", "rope_theta"), ("rms-norm-eps", "rms_norm_eps"),
                ("init-std", "initializer_range"),
                ("routed-scaling-factor", "routed_scaling_factor"))


def add_model_arguments(parser, **defaults):
    """A flag for every QwenMoeConfig field (EP = the world size); defaults: the config's,
    overridden by ``defaults`` (field name -> value)."""
    base = {f: getattr(QwenMoeConfig(), f) for f in QwenMoeConfig.__dataclass_fields__}
    base.update(defaults)
    g = parser.add_argument_group("model")
    for flag, field in _INT_FLAGS:
        g.add_argument("--" + flag, dest=field, type=int, default=base[field],
                       help=f"{field} (default {base[field]})")
    for flag, field in _FLOAT_FLAGS:
        g.add_argument("--" + flag, dest=field, type=float, default=base[field],
                       help=f"{field} (default {base[field]})")
    g.add_argument("--capacity-factor", dest="expert_capacity_factor", type=_capacity,
                   default=base["expert_capacity_factor"],
                   help="MegaMoeExperts expert_capacity_factor (none = lossless, the default)")
    g.add_argument("--schedule", choices=("O0", "O1"), default=base["schedule"],
                   help="MegaMoeExperts schedule (default O1)")
    g.add_argument("--dispatch-mode", choices=("push", "pull"), default=base["dispatch_mode"],
                   help="MegaMoeExperts dispatch_mode (HyperParallel's spelling; default unset)")
    g.add_argument("--initial-capacity-factor", type=_capacity,
                   default=base["initial_capacity_factor"],
                   help="MegaMoeExperts initial_capacity_factor (push; default unset)")
    g.add_argument("--capacity-growth-factor", type=_capacity,
                   default=base["capacity_growth_factor"],
                   help="MegaMoeExperts capacity_growth_factor (push; default unset)")
    return g


def config_from_args(args, ep_size):
    fields = {f: getattr(args, f) for f in QwenMoeConfig.__dataclass_fields__ if hasattr(args, f)}
    fields["ep_size"] = ep_size
    return QwenMoeConfig(**fields)


def build_model(cfg, backend, seed, group=None):
    """QwenMoeModel from ``seed`` with routed experts "mega_moe" (B: MegaMoeExperts) or
    "common" (A: CommonEPExperts), expert parallel over ``group`` (default WORLD)."""
    group = dist.group.WORLD if group is None else group
    torch.manual_seed(seed)
    if backend == "mega_moe":
        return QwenMoeModel(cfg, ep_group=group)
    if backend != "common":
        raise ValueError(f"backend must be 'mega_moe' or 'common', got {backend!r}")
    return QwenMoeModel(cfg, experts_factory=lambda c: CommonEPExperts(
        c.hidden_size, c.intermediate_size, c.num_experts, c.top_k, c.ep_size, group))


@torch.no_grad()
def copy_weights_from_mega(common, mega):
    """Give A (common) B's weights: dense ones as they are, expert shards converted."""
    dense = {k: v for k, v in mega.state_dict().items() if ".mlp.experts." not in k}
    missing, _ = common.load_state_dict(dense, strict=False)
    if any(".mlp.experts." not in k for k in missing):
        raise RuntimeError(f"the two models differ outside the experts: {missing}")
    for lc, lm in zip(common.layers, mega.layers):
        lc.mlp.experts.copy_from_mega(lm.mlp.experts)


class MasterWeightAdamW:
    """torch.optim.AdamW over fp32 copies of the model's bfloat16 parameters.

    step(): bf16 gradients -> fp32 master gradients (dense ones summed over the ranks in one
    flat all-reduce: each rank backpropagates loss / world, so the sum is the gradient of the
    mean loss; expert gradients already hold every rank's tokens), AdamW on the masters, masters
    rounded back into the model. A missing gradient (an expert that got no tokens in torch
    autograd) counts as zero, as MegaMoeExperts reports it."""

    def __init__(self, model, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01,
                 group=None):
        self.group = group
        self.dense = list(model.dense_parameters())
        self.experts = list(model.expert_parameters())
        self.params = self.dense + self.experts
        self.masters = [p.detach().float().clone() for p in self.params]
        n_dense = sum(p.numel() for p in self.dense)
        self._flat = torch.zeros(n_dense, dtype=torch.float32)
        off = 0
        for m, p in zip(self.masters, self.params):
            if off < n_dense:
                m.grad = self._flat[off:off + p.numel()].view_as(m)
                off += p.numel()
            else:
                m.grad = torch.zeros_like(m)
        self.opt = torch.optim.AdamW(self.masters, lr=lr, betas=betas, eps=eps,
                                     weight_decay=weight_decay, foreach=True)

    def zero_grad(self):
        for p in self.params:
            p.grad = None

    @torch.no_grad()
    def step(self):
        for m, p in zip(self.masters, self.params):
            if p.grad is None:
                m.grad.zero_()
            else:
                m.grad.copy_(p.grad)
        if dist.is_initialized() and dist.get_world_size(self.group) > 1:
            dist.all_reduce(self._flat, group=self.group)
        self.opt.step()
        for m, p in zip(self.masters, self.params):
            p.copy_(m)

    def state_dict(self):
        return {"adamw": self.opt.state_dict(), "masters": [m.detach() for m in self.masters]}

    @torch.no_grad()
    def load_state_dict(self, state):
        for m, p, saved in zip(self.masters, self.params, state["masters"]):
            m.copy_(saved)
            p.copy_(m)
        self.opt.load_state_dict(state["adamw"])


class _Stamp(torch.autograd.Function):
    """Identity whose forward and backward record a time: placed on the experts' inputs
    ("begin") and output ("end"), its backward marks where the experts' backward ends / begins."""

    @staticmethod
    def forward(ctx, timer, edge, *xs):
        ctx.timer, ctx.edge = timer, edge
        outs = tuple(x.view_as(x) for x in xs)
        return outs if len(outs) > 1 else outs[0]

    @staticmethod
    def backward(ctx, *grads):
        ctx.timer._backward_edge(ctx.edge)
        return (None, None) + grads


class ExpertsTimer:
    """Seconds spent in the routed-experts call of every layer, forward and backward.

    Forward hooks on each experts module stamp the call; identity autograd nodes on its
    differentiable inputs and its output stamp the backward (autograd runs the experts' backward
    between them: nothing else depends on those nodes). Same hooks for both implementations."""

    def __init__(self, model):
        self.forward_s = self.backward_s = 0.0
        self._t_fwd = self._t_bwd = None
        self.handles = []
        for layer in model.layers:
            mod = layer.mlp.experts
            self.handles.append(mod.register_forward_pre_hook(self._pre))
            self.handles.append(mod.register_forward_hook(self._post))

    def reset(self):
        self.forward_s = self.backward_s = 0.0

    @property
    def total_s(self):
        return self.forward_s + self.backward_s

    def _pre(self, module, args):
        hidden, ids, weights = args[:3]
        hidden, weights = _Stamp.apply(self, "begin", hidden, weights)
        self._t_fwd = time.perf_counter()
        return (hidden, ids, weights) + tuple(args[3:])

    def _post(self, module, args, out):
        self.forward_s += time.perf_counter() - self._t_fwd
        return _Stamp.apply(self, "end", out)

    def _backward_edge(self, edge):
        now = time.perf_counter()
        if edge == "end":          # the output's gradient arrived: the experts' backward starts
            self._t_bwd = now
        elif self._t_bwd is not None:
            self.backward_s += now - self._t_bwd
            self._t_bwd = None

    def remove(self):
        for h in self.handles:
            h.remove()
        self.handles = []


def forward_backward(model, input_ids, labels, world):
    """Forward and backward of one step; returns (local loss, logits), both detached."""
    out = model(input_ids, labels)
    (out["loss"] / world).backward()
    return out["loss"].detach(), out["logits"].detach()


def optimizer_step(model, opt, input_ids, labels, world):
    """One complete optimizer step: zero grads, forward, backward, gradient sync, AdamW."""
    opt.zero_grad()
    loss, logits = forward_backward(model, input_ids, labels, world)
    opt.step()
    return loss, logits


def save_checkpoint(path, model, opt, extra):
    """This rank's checkpoint: the model (dense weights and this rank's expert shards), the
    optimizer (fp32 masters and AdamW moments) and ``extra`` (step, config, ...)."""
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    tmp = path + ".tmp"
    torch.save({"model": model.state_dict(), "optimizer": opt.state_dict(), **extra}, tmp)
    os.replace(tmp, path)


def load_checkpoint(path, model, opt):
    state = torch.load(path)
    model.load_state_dict(state["model"])
    opt.load_state_dict(state["optimizer"])
    return state
