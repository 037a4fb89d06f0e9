"""The optimizer step both scripts use: AdamW on fp32 master weights of a bfloat16 model,
dense gradients averaged over the ranks, expert gradients kept on their owner; a timer for the
routed-experts call inside the step; per-rank checkpoints; process-group setup.
"""
import argparse
import math
import os
import re
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

# torch >= 2.1's AdamW updates the first moment with lerp_ (1.13: mul_ + add_)
_ADAM_LERP = tuple(int(x) for x in re.findall(r"\d+", torch.__version__)[:2]) >= (2, 1)


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


_M_TRIM_THRESHOLD, _M_MMAP_MAX = -1, -4  # glibc's mallopt parameters (malloc.h)


def keep_freed_memory():
    """Make glibc's malloc keep freed memory for the next step instead of giving it back.

    A training step allocates the same large tensors every time. glibc serves each block of
    32 MiB or more with its own mmap and munmaps it on free, so the next step takes the same
    memory again page by page, every page zeroed by the kernel: ~300,000 page faults and about
    0.6 s of kernel time per step per rank at the default benchmark config. With mmap off
    and no trimming, freed blocks stay in the heap and are reused (what jemalloc or tcmalloc,
    or torch's caching allocators on GPUs, do). Returns True when applied; a non-glibc libc,
    an LD_PRELOADed allocator or MALLOC_* settings of the user's own are left alone."""
    import ctypes
    import ctypes.util
    if os.environ.get("LD_PRELOAD") or any(k.startswith(("MALLOC_", "GLIBC_TUNABLES"))
                                           for k in os.environ):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        if not hasattr(libc, "gnu_get_libc_version"):
            return False
        ok = libc.mallopt(_M_MMAP_MAX, 0) == 1
        return libc.mallopt(_M_TRIM_THRESHOLD, 2**31 - 1) == 1 and ok
    except OSError:
        return False


malloc_keeps_freed_memory = False  # set by init_distributed


def init_distributed(threads=0, tune_malloc=True):
    """gloo process group from the launcher's env (torchrun or `megamoe launch`), or a
    one-rank group when started without a launcher; torch gets this rank's share of the cores
    (MegaMoeExperts takes the same share for its workers). ``tune_malloc``: keep_freed_memory()."""
    global malloc_keeps_freed_memory
    if tune_malloc:
        malloc_keeps_freed_memory = keep_freed_memory()
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
              ("shared-intermediate", "shared_expert_intermediate_size"),
              ("attention-block", "attention_block_size"))
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
    parser.add_argument_group("process").add_argument(
        "--malloc-defaults", action="store_true",
        help="leave glibc's malloc as it is (default: keep freed memory for reuse, "
             "training.keep_freed_memory)")
    g.add_argument("--capacity-factor", dest="expert_capacity_factor", type=_capacity,
                   default=base["expert_capacity_factor"],
                   help="MegaMoeExperts expert_capacity_factor (none = lossless, the default)")
    g.add_argument("--schedule", choices=("O0", "O1"), default=base["schedule"],
                   help="MegaMoeExperts schedule (default O1)")
    g.add_argument("--replicas", dest="replica_slots_per_rank", type=int,
                   default=base["replica_slots_per_rank"],
                   help="MegaMoeExperts replica_slots_per_rank: guest slots per rank for copies "
                        "of the hottest experts (0 = off, the default; B only)")
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
    """AdamW over fp32 master copies of a bfloat16 model's parameters.

    step(): bf16 gradients -> fp32 (dense ones summed over the ranks in one flat all-reduce:
    each rank backpropagates loss / world, so the sum is the gradient of the mean loss; expert
    gradients already hold every rank's tokens), AdamW on the masters, masters rounded back into
    the model. A missing gradient (an expert that got no tokens in torch autograd) counts as
    zero, as MegaMoeExperts reports it.

    The update is torch.optim.AdamW's (its single-tensor form, the same operations in the same
    order, so the same bits; a test checks it), run over slices of ``chunk`` elements: masters,
    moments and gradients live in flat fp32 buffers, and every slice goes through all of its
    passes (gradient conversion, decay, both moments, the step, the bf16 copy back) while it is
    in the L2 cache. torch's foreach AdamW makes each pass over all 32 M parameters of the
    default benchmark model, from memory: 230 ms per step there, against ~60 ms this way.
    """

    def __init__(self, model, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01,
                 group=None, chunk=1 << 16):
        self.group = group
        self.lr, self.betas, self.eps, self.weight_decay = lr, betas, eps, weight_decay
        self.dense = list(model.dense_parameters())
        self.experts = list(model.expert_parameters())
        self.params = self.dense + self.experts
        self.step_count = 0
        sizes = [p.numel() for p in self.params]
        self.n_dense = sum(p.numel() for p in self.dense)
        total = sum(sizes)
        self.flat_master = torch.empty(total, dtype=torch.float32)
        self.exp_avg = torch.zeros(total, dtype=torch.float32)
        self.exp_avg_sq = torch.zeros(total, dtype=torch.float32)
        self._dense_grad = torch.zeros(self.n_dense, dtype=torch.float32)
        self._grad = torch.empty(chunk, dtype=torch.float32)    # an expert gradient slice
        self._denom = torch.empty(chunk, dtype=torch.float32)
        self.masters, self._slices, off = [], [], 0
        with torch.no_grad():
            for p, n in zip(self.params, sizes):
                m = self.flat_master[off:off + n]
                m.copy_(p.detach().reshape(-1))
                self.masters.append(m.view(p.shape))
                # (param, offset in the flat buffers, slices of at most `chunk` elements)
                self._slices.append((p, off, [(a, min(n, a + chunk)) for a in range(0, n, chunk)]))
                off += n

    def zero_grad(self):
        for p in self.params:
            p.grad = None

    @torch.no_grad()
    def step(self):
        off = 0
        for p in self.dense:
            n = p.numel()
            if p.grad is None:
                self._dense_grad[off:off + n].zero_()
            else:
                self._dense_grad[off:off + n].copy_(p.grad.reshape(-1))
            off += n
        pending = None
        if dist.is_initialized() and dist.get_world_size(self.group) > 1:
            # summed in the background while the expert slices (local gradients) update
            pending = dist.all_reduce(self._dense_grad, group=self.group, async_op=True)
        self.step_count += 1
        beta1, beta2 = self.betas
        self._bias_correction = (1 - beta1 ** self.step_count, 1 - beta2 ** self.step_count)
        n_dense_params = len(self.dense)
        for p, base, slices in self._slices[n_dense_params:]:
            self._update(p, base, slices)
        if pending is not None:
            pending.wait()
        for p, base, slices in self._slices[:n_dense_params]:
            self._update(p, base, slices)

    def _update(self, p, base, slices):
        """AdamW on one parameter's slices, each through all of its passes while in cache."""
        beta1, beta2 = self.betas
        lr, eps = self.lr, self.eps
        bias_correction1, bias_correction2 = self._bias_correction
        step_size = lr / bias_correction1
        bias_correction2_sqrt = math.sqrt(bias_correction2)
        decay = 1 - lr * self.weight_decay
        flat_p = p.view(-1)
        grad = p.grad.view(-1) if p.grad is not None else None
        for a, b in slices:
            lo, hi = base + a, base + b
            param = self.flat_master[lo:hi]
            exp_avg, exp_avg_sq = self.exp_avg[lo:hi], self.exp_avg_sq[lo:hi]
            if lo < self.n_dense:
                g = self._dense_grad[lo:hi]
            elif grad is None:
                g = self._grad[:b - a].zero_()
            else:
                g = self._grad[:b - a].copy_(grad[a:b])
            # torch.optim.AdamW, single-tensor form (torch/optim/adamw.py): 1.13 moves exp_avg by
            # mul_ + add_, torch 2.x by lerp_ (not the same bits)
            param.mul_(decay)
            if _ADAM_LERP:
                exp_avg.lerp_(g, 1 - beta1)
            else:
                exp_avg.mul_(beta1).add_(g, alpha=1 - beta1)
            exp_avg_sq.mul_(beta2).addcmul_(g, g, value=1 - beta2)
            denom = torch.sqrt(exp_avg_sq, out=self._denom[:b - a])
            denom.div_(bias_correction2_sqrt).add_(eps)
            param.addcdiv_(exp_avg, denom, value=-step_size)
            flat_p[a:b].copy_(param)

    def state_dict(self):
        return {"step": self.step_count, "masters": self.flat_master.clone(),
                "exp_avg": self.exp_avg.clone(), "exp_avg_sq": self.exp_avg_sq.clone(),
                "hyper": {"lr": self.lr, "betas": self.betas, "eps": self.eps,
                          "weight_decay": self.weight_decay}}

    @torch.no_grad()
    def load_state_dict(self, state):
        for name in ("masters", "exp_avg", "exp_avg_sq"):
            if state[name].shape != self.flat_master.shape:
                raise ValueError(f"optimizer state {name} has {state[name].numel()} elements, "
                                 f"this model {self.flat_master.numel()}")
        self.flat_master.copy_(state["masters"])
        self.exp_avg.copy_(state["exp_avg"])
        self.exp_avg_sq.copy_(state["exp_avg_sq"])
        self.step_count = int(state["step"])
        for p, m in zip(self.params, self.masters):
            p.copy_(m)


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
