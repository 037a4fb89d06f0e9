"""A Qwen-MoE decoder whose routed experts are MegaMoeExperts (CPU, bfloat16, expert parallel).

Copy this into a model: everything but the routed experts is plain PyTorch —
RMSNorm, grouped-query attention with rotary position embeddings and a causal mask, a router
(linear -> top-k of the logits -> softmax over the k chosen logits x routed scaling factor) and an
always-on shared SwiGLU expert. The router's exact per-expert histogram goes to the experts as
``tokens_per_expert``. All layers' experts share one set of execution resources
(``MegaMoeExperts.share_execution_resources``, called once, before the first forward), and
``model.close()`` releases them (every rank, after the last backward, before the process group
goes).

Every rank holds the dense weights (data parallel: average their gradients over the ranks) and
E/EP routed experts (expert parallel: their gradients are complete on the owning rank);
:meth:`QwenMoeModel.expert_parameters` tells the two apart. ``examples/qwen_moe/training.py`` has
the optimizer step that does this.
"""
import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from megamoe import MegaMoeExperts


@dataclass(frozen=True)
class QwenMoeConfig:
    """Shapes of the model; validated on construction (ValueError names the rule).

    ``batch_size`` sequences of ``seq_len`` tokens per rank make the experts' fixed
    ``local_num_tokens`` (T, a multiple of 128). The experts' receive capacity: the seed's
    ``expert_capacity_factor`` (None = lossless), or HyperParallel's ``dispatch_mode`` ("push"
    with ``initial_capacity_factor`` / ``capacity_growth_factor``, or "pull"); unset fields are
    not passed to MegaMoeExperts, so its defaults apply.
    """
    vocab_size: int = 256
    hidden_size: int = 1024
    num_layers: int = 2
    num_attention_heads: int = 16
    num_key_value_heads: int = 2
    seq_len: int = 1024
    batch_size: int = 1
    attention_block_size: int = 128
    rms_norm_eps: float = 1e-6
    rope_theta: float = 1e6
    initializer_range: float = 0.02
    num_experts: int = 16
    top_k: int = 4
    intermediate_size: int = 512
    shared_expert_intermediate_size: int = 512
    routed_scaling_factor: float = 1.0
    ep_size: int = 2
    expert_capacity_factor: float = None
    schedule: str = "O1"
    dispatch_mode: str = None
    initial_capacity_factor: float = None
    capacity_growth_factor: float = None
    replica_slots_per_rank: int = 0

    @property
    def local_num_tokens(self):
        return self.batch_size * self.seq_len

    @property
    def head_dim(self):
        return self.hidden_size // self.num_attention_heads

    def __post_init__(self):
        for name in ("vocab_size", "hidden_size", "num_layers", "num_attention_heads",
                     "num_key_value_heads", "seq_len", "batch_size", "num_experts", "top_k",
                     "intermediate_size", "shared_expert_intermediate_size", "ep_size",
                     "attention_block_size"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
                raise ValueError(f"{name} must be a positive integer, got {v!r}")
        for name in ("rms_norm_eps", "rope_theta", "initializer_range", "routed_scaling_factor"):
            v = getattr(self, name)
            if not (isinstance(v, (int, float)) and math.isfinite(v) and v > 0):
                raise ValueError(f"{name} must be a finite positive number, got {v!r}")
        if self.hidden_size % self.num_attention_heads:
            raise ValueError(f"hidden_size ({self.hidden_size}) must be divisible by "
                             f"num_attention_heads ({self.num_attention_heads})")
        if self.head_dim % 2:
            raise ValueError(f"the head dimension hidden_size / num_attention_heads = "
                             f"{self.head_dim} must be even (rotary embeddings rotate pairs)")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(f"num_attention_heads ({self.num_attention_heads}) must be "
                             f"divisible by num_key_value_heads ({self.num_key_value_heads})")
        if self.num_experts % self.ep_size:
            raise ValueError(f"num_experts ({self.num_experts}) must be divisible by ep_size "
                             f"({self.ep_size}): every rank owns E/EP experts")
        if self.top_k > self.num_experts:
            raise ValueError(f"top_k ({self.top_k}) cannot exceed num_experts "
                             f"({self.num_experts})")
        if self.local_num_tokens % 128:
            raise ValueError(f"batch_size * seq_len = {self.local_num_tokens} tokens per rank "
                             "must be a multiple of 128 (MegaMoeExperts' fixed T)")
        for name in ("expert_capacity_factor", "initial_capacity_factor",
                     "capacity_growth_factor"):
            f = getattr(self, name)
            if f is not None and (isinstance(f, bool) or not isinstance(f, (int, float))
                                  or not math.isfinite(f) or f < 1):
                raise ValueError(f"{name} must be None or a finite number >= 1, got {f!r}")
        if (isinstance(self.replica_slots_per_rank, bool)
                or not isinstance(self.replica_slots_per_rank, int)
                or not 0 <= self.replica_slots_per_rank <= 64):
            raise ValueError("replica_slots_per_rank must be an integer in [0, 64], got "
                             f"{self.replica_slots_per_rank!r}")
        if self.schedule not in ("O0", "O1"):
            raise ValueError(f"schedule must be 'O0' or 'O1', got {self.schedule!r}")
        if self.dispatch_mode not in (None, "push", "pull"):
            raise ValueError(f"dispatch_mode must be None, 'push' or 'pull', got "
                             f"{self.dispatch_mode!r}")


class _RMSNormFunction(torch.autograd.Function):
    """y = weight * round_bf16(x * rsqrt(mean(x^2) + eps)), the statistics in fp32.

    The backward is written out: autograd through the eight ops of the forward makes about
    fifteen passes over [T, H] fp32 tensors and allocates each of them (14 ms per norm at the
    default config, against ~4 ms here); only x and the [T, 1] rsqrt are kept for it."""

    @staticmethod
    def forward(ctx, x, weight, eps):
        xf = x.float()
        rstd = torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
        ctx.save_for_backward(x, weight, rstd)
        return weight * (xf * rstd).to(x.dtype)

    @staticmethod
    def backward(ctx, grad):
        x, weight, rstd = ctx.saved_tensors
        xhat = x.float().mul_(rstd)                                  # x * rstd, fp32
        grad_weight = None
        if ctx.needs_input_grad[1]:
            dims = tuple(range(grad.dim() - 1))
            grad_weight = (grad.float() * xhat.to(x.dtype).float()).sum(dims).to(weight.dtype)
        g = (grad * weight).float()                                  # d/d(x * rstd), fp32
        # d/dx of x * rstd(x): rstd * (g - xhat * mean(g * xhat))
        dot = (g * xhat).mean(-1, keepdim=True)
        grad_x = g.sub_(xhat.mul_(dot)).mul_(rstd).to(x.dtype)
        return grad_x, grad_weight, None


class RMSNorm(nn.Module):
    def __init__(self, hidden_size, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.eps = eps

    def forward(self, x):
        return _RMSNormFunction.apply(x, self.weight, self.eps)


def _rotate_half(x):
    a, b = x.chunk(2, dim=-1)
    return torch.cat((-b, a), dim=-1)


class Attention(nn.Module):
    """Causal grouped-query attention with rotary embeddings, computed in blocks of query rows.

    Head h uses KV head h // group. q is laid out [b, nkv, s, group, hd], so a block of query
    positions of one KV head's whole group is one contiguous [block * group, hd] matrix and one
    batched matmul serves it without repeating K and V. A block only attends to the keys up to
    its last position: a causal model needs only the lower triangle of the score matrix (about
    half of it at seq 1024 with blocks of 128), and each block's fp32 scores and probabilities
    are a few MiB that stay in cache instead of s x s matrices per head that stream through
    memory (the full-matrix form spent 263 ms per layer forward+backward at the default
    config, the blocked one 85 ms; same outputs, the K/V gradients summed in another order).
    The softmax is fp32 (its input converted, its output rounded to bf16 once)."""

    def __init__(self, cfg):
        super().__init__()
        self.nh, self.nkv, self.hd = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        self.group = self.nh // self.nkv
        self.block = cfg.attention_block_size
        h = cfg.hidden_size
        self.q_proj = nn.Linear(h, self.nh * self.hd, bias=False)
        self.k_proj = nn.Linear(h, self.nkv * self.hd, bias=False)
        self.v_proj = nn.Linear(h, self.nkv * self.hd, bias=False)
        self.o_proj = nn.Linear(self.nh * self.hd, h, bias=False)
        inv_freq = cfg.rope_theta ** (-torch.arange(0, self.hd, 2, dtype=torch.float64) / self.hd)
        angles = torch.outer(torch.arange(cfg.seq_len, dtype=torch.float64), inv_freq)
        angles = torch.cat((angles, angles), dim=-1)
        self.register_buffer("rope_cos", angles.cos().float(), persistent=False)
        self.register_buffer("rope_sin", angles.sin().float(), persistent=False)
        mask = torch.ones(cfg.seq_len, cfg.seq_len, dtype=torch.bool).triu(1)
        self.register_buffer("causal_mask", mask, persistent=False)

    def _rope(self, x, cos, sin):
        xf = x.float()
        return (xf * cos + _rotate_half(xf) * sin).to(x.dtype)

    def forward(self, x):
        b, s, _ = x.shape
        nkv, g, hd = self.nkv, self.group, self.hd
        cos, sin = self.rope_cos[:s], self.rope_sin[:s]                      # [s, hd]
        q = self.q_proj(x).view(b, s, nkv, g, hd) * hd ** -0.5
        q = self._rope(q, cos[:, None, None], sin[:, None, None])
        q = q.permute(0, 2, 1, 3, 4).contiguous()                            # [b, nkv, s, g, hd]
        k = self._rope(self.k_proj(x).view(b, s, nkv, hd), cos[:, None], sin[:, None])
        k = k.transpose(1, 2)                                                # [b, nkv, s, hd]
        v = self.v_proj(x).view(b, s, nkv, hd).transpose(1, 2)
        blocks = []
        for q0 in range(0, s, self.block):
            q1 = min(s, q0 + self.block)
            rows = (q1 - q0) * g
            scores = torch.matmul(q[:, :, q0:q1].reshape(b, nkv, rows, hd),
                                  k[:, :, :q1].transpose(-1, -2))            # [b, nkv, rows, q1]
            # -inf is a bf16 value; masking out of place keeps autograd from copying the
            # whole block back through a view (an in-place fill on a view of it did)
            scores = scores.view(b, nkv, q1 - q0, g, q1).masked_fill(
                self.causal_mask[q0:q1, None, :q1], float("-inf")).view(b, nkv, rows, q1)
            probs = F.softmax(scores, dim=-1, dtype=torch.float32).to(x.dtype)
            blocks.append(torch.matmul(probs, v[:, :, :q1]).view(b, nkv, q1 - q0, g * hd))
        out = torch.cat(blocks, dim=2) if len(blocks) > 1 else blocks[0]     # [b, nkv, s, g*hd]
        return self.o_proj(out.transpose(1, 2).reshape(b, s, -1))


class SwiGLU(nn.Module):
    def __init__(self, hidden_size, intermediate_size):
        super().__init__()
        self.gate_proj = nn.Linear(hidden_size, intermediate_size, bias=False)
        self.up_proj = nn.Linear(hidden_size, intermediate_size, bias=False)
        self.down_proj = nn.Linear(intermediate_size, hidden_size, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Router(nn.Module):
    """Top-k of the router logits; weights = softmax over the k chosen logits x scale.

    The gate is a bf16 linear like the rest of the model (as in Qwen-MoE); its logits are taken
    to fp32 for the top-k and the softmax. (An fp32 gate would run through the system's fp32
    BLAS: with Debian's reference BLAS that cost 21 ms per layer, forward + backward, against
    0.4 ms for the bf16 one through oneDNN.)"""

    def __init__(self, cfg):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(cfg.num_experts, cfg.hidden_size))
        self.top_k, self.scale = cfg.top_k, cfg.routed_scaling_factor

    def logits(self, x):
        return F.linear(x, self.weight).float()

    def weights_for(self, logits, topk_ids):
        """Router weights of the chosen experts from their logits."""
        return F.softmax(logits.gather(-1, topk_ids), dim=-1) * self.scale

    def forward(self, x):
        """x [T, H] -> (topk_weights [T, K] fp32, topk_ids [T, K] int64)."""
        logits = self.logits(x)
        topk_ids = torch.topk(logits, self.top_k, dim=-1).indices
        return self.weights_for(logits, topk_ids), topk_ids


def mega_moe_experts(cfg, ep_group=None):
    """The routed experts of one layer: MegaMoeExperts on this rank's E/EP experts."""
    # HyperParallel's capacity spelling, passed only when set (docs/moe.md "Capacity and
    # dispatch modes": one spelling per layer; MegaMoeExperts raises ValueError otherwise)
    kwargs = {k: getattr(cfg, k) for k in ("dispatch_mode", "initial_capacity_factor",
                                           "capacity_growth_factor")
              if getattr(cfg, k) is not None}
    return MegaMoeExperts(local_num_tokens=cfg.local_num_tokens, hidden_size=cfg.hidden_size,
                          intermediate_size=cfg.intermediate_size, num_experts=cfg.num_experts,
                          top_k=cfg.top_k, expert_capacity_factor=cfg.expert_capacity_factor,
                          ep_size=cfg.ep_size, ep_group=ep_group, schedule=cfg.schedule,
                          replica_slots_per_rank=cfg.replica_slots_per_rank, **kwargs)


class MoeBlock(nn.Module):
    """Router, routed experts and the always-on shared expert."""

    def __init__(self, cfg, experts):
        super().__init__()
        self.cfg = cfg
        self.gate = Router(cfg)
        self.experts = experts
        self.shared_expert = SwiGLU(cfg.hidden_size, cfg.shared_expert_intermediate_size)

    def forward(self, x):
        shape = x.shape
        flat = x.reshape(-1, shape[-1])
        topk_weights, topk_ids = self.gate(flat)
        # the exact local histogram: MegaMoeExperts then needs no counting pass of its own
        tokens_per_expert = torch.bincount(topk_ids.reshape(-1),
                                           minlength=self.cfg.num_experts).to(torch.int32)
        routed = self.experts(flat, topk_ids, topk_weights, tokens_per_expert=tokens_per_expert)
        return (routed + self.shared_expert(flat)).view(shape)


class DecoderLayer(nn.Module):
    def __init__(self, cfg, experts):
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = Attention(cfg)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = MoeBlock(cfg, experts)

    def forward(self, x):
        x = x + self.self_attn(self.input_layernorm(x))
        return x + self.mlp(self.post_attention_layernorm(x))


class QwenMoeModel(nn.Module):
    """Decoder-only Qwen-MoE language model in bfloat16.

    ``experts_factory(cfg)`` builds one layer's routed experts (default: MegaMoeExperts over
    ``ep_group``); anything with MegaMoeExperts' call signature works (benchmark.py passes the
    plain-torch CommonEPExperts). Build it identically on every rank.
    """

    def __init__(self, cfg, ep_group=None, experts_factory=None):
        super().__init__()
        self.config = cfg
        if experts_factory is None:
            def experts_factory(c):
                return mega_moe_experts(c, ep_group)
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(cfg, experts_factory(cfg))
                                    for _ in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        self._init_weights(cfg.initializer_range)
        self.to(torch.bfloat16)
        experts = [layer.mlp.experts for layer in self.layers]
        if all(isinstance(e, MegaMoeExperts) for e in experts):
            # one workspace for all layers (they run one after the other); before any forward
            MegaMoeExperts.share_execution_resources(experts)

    @torch.no_grad()
    def _init_weights(self, std):
        """Qwen's initialisation: every matrix (routed experts included) from N(0, std);
        norms start at 1."""
        for p in self.parameters():
            if p.dim() >= 2:
                p.normal_(mean=0.0, std=std)

    def expert_parameters(self):
        """This rank's routed-expert parameters (expert parallel: not averaged over ranks)."""
        return [p for layer in self.layers for p in layer.mlp.experts.parameters()]

    def dense_parameters(self):
        """Parameters every rank holds a copy of (data parallel: average their gradients)."""
        expert_ids = {id(p) for p in self.expert_parameters()}
        return [p for p in self.parameters() if id(p) not in expert_ids]

    def forward(self, input_ids, labels=None):
        """input_ids [batch_size, seq_len] -> {"logits": [b, s, vocab] bf16, "loss": the mean
        next-token cross entropy when labels (same shape, -100 = ignore) are given}."""
        x = self.embed_tokens(input_ids)
        for layer in self.layers:
            x = layer(x)
        logits = self.lm_head(self.norm(x))
        loss = None
        if labels is not None:
            targets = F.pad(labels, (0, 1), value=-100)[..., 1:]   # position t predicts t+1
            loss = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]),
                                   targets.reshape(-1), ignore_index=-100)
        return {"loss": loss, "logits": logits}

    def close(self):
        """Release the experts' execution resources: every rank, same order, after the last
        backward, before the process group is destroyed. Idempotent."""
        for layer in self.layers:
            layer.mlp.experts.close()
