"""Train the Qwen-MoE model on real text, B (MegaMoeExperts) and A (plain-torch EP) side by side.

    megamoe launch -n 2 -- /usr/bin/python3 examples/qwen_moe/train.py --steps 200 \
        --checkpoint-dir ckpt --plot loss.png
    /usr/bin/python3 examples/qwen_moe/train.py ...        # one rank, EP 1, no launcher

The text is every file matching --data (default: the licence texts Debian ships in
/usr/share/common-licenses), read as bytes: one token per byte, vocabulary 256. Step s on rank r
trains on batch_size windows of seq_len bytes at offsets drawn from (seed, s, r), so a run is
reproducible and both models see the same batches. Each step is one AdamW optimizer step with
fp32 master weights (training.py); the printed loss is the mean over all ranks' tokens.

--checkpoint-dir DIR saves DIR/step_<n>/<backend>/rank<r>.pt every --save-every steps and at the
end (model with this rank's experts, optimizer, step, losses so far); --resume DIR (its newest
step_<n>, or a given step_<n> directory) continues from there bit for bit (same losses, same weights as a run without the break). --plot writes both
loss curves (they lie on top of each other) and their difference as a PNG; --log the losses as
JSON; --profile DIR the MegaKernel trace of one B step.
"""
import argparse
import json
import os
import sys
import time

import torch
import torch.distributed as dist

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import training  # noqa: E402  (also puts the megamoe package on the path)
import megamoe  # noqa: E402

BACKENDS = ("mega_moe", "common", "fp32")
LABELS = {"mega_moe": "B: MegaMoeExperts", "common": "A: CommonEPExperts (plain torch EP)",
          "fp32": "A in float32 (reference)"}
# a model that learns visibly within a few hundred CPU steps
TRAIN_DEFAULTS = dict(hidden_size=256, num_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, seq_len=128, batch_size=4, num_experts=8, top_k=2,
                      intermediate_size=256, shared_expert_intermediate_size=256)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    training.add_model_arguments(p, **TRAIN_DEFAULTS)
    r = p.add_argument_group("training")
    r.add_argument("--data", default="/usr/share/common-licenses/*",
                   help="glob of text files (default: %(default)s)")
    r.add_argument("--steps", type=int, default=200, help="train until this many steps")
    r.add_argument("--backends", default="mega_moe,common",
                   help="comma-separated: mega_moe (B), common (A), fp32 (A's code in float32, "
                        "the reference both bf16 runs drift from); default mega_moe,common")
    r.add_argument("--lr", type=float, default=2e-3)
    r.add_argument("--weight-decay", type=float, default=0.01)
    r.add_argument("--seed", type=int, default=0)
    r.add_argument("--threads", type=int, default=0, help="torch threads per rank (0 = auto)")
    r.add_argument("--checkpoint-dir", metavar="DIR")
    r.add_argument("--save-every", type=int, default=0,
                   help="also checkpoint every N steps (0: only at the end)")
    r.add_argument("--resume", metavar="DIR",
                   help="continue from a checkpoint (DIR/step_<n>, or DIR's newest step_<n>)")
    r.add_argument("--log", metavar="FILE", help="write the losses as JSON (rank 0)")
    r.add_argument("--plot", metavar="PNG", help="write the loss curves as a PNG (rank 0)")
    r.add_argument("--profile", metavar="DIR",
                   help="write the MegaKernel trace of one B step (the run's second) to DIR")
    a = p.parse_args(argv)
    a.backends = [b.strip() for b in a.backends.split(",") if b.strip()]
    bad = [b for b in a.backends if b not in BACKENDS]
    if bad or not a.backends:
        p.error(f"--backends: choose from {', '.join(BACKENDS)} (got {a.backends})")
    if a.steps < 1 or a.save_every < 0:
        p.error("--steps must be >= 1 and --save-every >= 0")
    if a.vocab_size < 256:
        p.error("--vocab must be >= 256: the tokens are bytes")
    return a


class ByteText:
    """Every file of a glob, concatenated as bytes (sorted by name, blank line between)."""

    def __init__(self, pattern):
        import glob
        self.files = sorted(f for f in glob.glob(pattern) if os.path.isfile(f))
        if not self.files:
            raise SystemExit(f"train.py: no files match --data {pattern!r}")
        blob = b"\n\n".join(open(f, "rb").read() for f in self.files)
        self.tokens = torch.frombuffer(bytearray(blob), dtype=torch.uint8).long()

    def batch(self, seed, step, rank, batch_size, seq_len):
        """[batch_size, seq_len] windows at offsets that depend only on (seed, step, rank)."""
        n = self.tokens.numel() - seq_len
        if n <= 0:
            raise SystemExit(f"train.py: --data has {self.tokens.numel()} bytes, fewer than "
                             f"--seq-len {seq_len}")
        g = torch.Generator().manual_seed((seed * 1_000_003 + step) * 4099 + rank)
        starts = torch.randint(0, n, (batch_size,), generator=g)
        ids = torch.stack([self.tokens[s:s + seq_len] for s in starts.tolist()])
        return ids, ids.clone()


def ckpt_path(directory, backend, rank):
    return os.path.join(directory, backend, f"rank{rank}.pt")


def step_dir(directory, step):
    return os.path.join(directory, f"step_{step:06d}")


def resolve_resume(path):
    """A step_* directory as is; a checkpoint directory: its newest step_*."""
    if os.path.basename(os.path.normpath(path)).startswith("step_"):
        return path
    steps = sorted(d for d in os.listdir(path) if d.startswith("step_")) \
        if os.path.isdir(path) else []
    if not steps:
        raise SystemExit(f"train.py: --resume {path}: no step_* checkpoint in it")
    return os.path.join(path, steps[-1])


def summary(losses):
    """Mean loss over the second half of the steps per backend, and how far each bf16 run is
    from the fp32 one on average (mean |difference| per step) when it ran."""
    n = min(len(v) for v in losses.values())
    h = n // 2
    text = "mean loss over steps %d..%d: " % (h + 1, n) + ", ".join(
        f"{k} {sum(v[h:n]) / max(1, n - h):.4f}" for k, v in losses.items())
    if "fp32" in losses and len(losses) > 1:
        ref = losses["fp32"]
        text += "; mean |loss - fp32 loss|: " + ", ".join(
            f"{k} {sum(abs(x - y) for x, y in zip(v[h:n], ref[h:n])) / max(1, n - h):.4f}"
            for k, v in losses.items() if k != "fp32")
    return text


def plot(path, losses, start, title):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(8, 6), sharex=True,
                                      gridspec_kw={"height_ratios": [3, 1]})
    for key, style in (("common", dict(lw=3, alpha=0.45)), ("mega_moe", dict(lw=1.2)),
                       ("fp32", dict(lw=1, color="black", ls="--"))):
        if key in losses:
            top.plot(range(1, len(losses[key]) + 1), losses[key], label=LABELS[key], **style)
    top.set_ylabel("training loss (nats / byte)")
    top.set_title(title, fontsize=9)
    top.legend()
    top.grid(alpha=0.3)
    pairs = [(x, y, c) for x, y, c in (("mega_moe", "common", "tab:red"),
                                        ("mega_moe", "fp32", "tab:orange"),
                                        ("common", "fp32", "tab:blue"))
             if x in losses and y in losses]
    for x, y, color in pairs:
        diff = [b - a for a, b in zip(losses[y], losses[x])]
        bottom.plot(range(1, len(diff) + 1), diff, color=color, lw=1,
                    label=f"{LABELS[x].split(':')[0]} - {LABELS[y].split(':')[0].split(' ')[0]}"
                    if y != "fp32" else f"{LABELS[x].split(':')[0]} - fp32")
    if pairs:
        bottom.axhline(0, color="black", lw=0.5)
        bottom.set_ylabel("difference")
        if len(pairs) > 1:
            bottom.legend(fontsize=7)
    if start:
        for ax in (top, bottom):
            ax.axvline(start + 0.5, color="gray", ls=":", lw=1)
    bottom.set_xlabel("optimizer step")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv=None):
    a = parse_args(argv)
    rank, world, _ = training.init_distributed(
        a.threads, tune_malloc=not a.malloc_defaults)
    cfg = training.config_from_args(a, world)
    text = ByteText(a.data)
    models, opts = {}, {}
    try:
        for key in a.backends:
            models[key] = training.build_model(cfg, "common" if key == "fp32" else key, a.seed)
            if key == "fp32":
                models[key].float()
        if "mega_moe" in models:  # A (and its fp32 twin) start from B's weights
            for key in ("common", "fp32"):
                if key in models:
                    training.copy_weights_from_mega(models[key], models["mega_moe"])
        for key, m in models.items():
            opts[key] = training.MasterWeightAdamW(m, lr=a.lr, weight_decay=a.weight_decay)
        start, losses = 0, {k: [] for k in models}
        if a.resume:
            resume = resolve_resume(a.resume)
            for key in models:
                state = training.load_checkpoint(ckpt_path(resume, key, rank), models[key],
                                                 opts[key])
                if state["config"] != cfg.__dict__ or state["world_size"] != world:
                    raise SystemExit(f"train.py: {a.resume} was written for another model or "
                                     f"world size ({state['config']}, {state['world_size']} "
                                     f"ranks); use the same flags and rank count")
                start, losses[key] = state["step"], list(state["losses"])
        if rank == 0:
            print(f"train.py: {len(text.files)} files, {text.tokens.numel()} bytes; "
                  f"{world} ranks x {cfg.local_num_tokens} tokens per step; "
                  f"{', '.join(LABELS[k] for k in models)}; steps {start + 1}..{a.steps}",
                  file=sys.stderr, flush=True)
        bar = None
        if rank == 0 and sys.stderr.isatty():
            from tqdm import tqdm
            bar = tqdm(total=a.steps, initial=start, unit="step", file=sys.stderr,
                       dynamic_ncols=True)
        t_run = time.perf_counter()
        for step in range(start, a.steps):
            batch = text.batch(a.seed, step, rank, cfg.batch_size, cfg.seq_len)
            step_losses = torch.zeros(len(models), dtype=torch.float64)
            for i, key in enumerate(models):
                profile = (a.profile and key == "mega_moe"
                           and step == min(start + 1, a.steps - 1))
                if profile:
                    with megamoe.profiler.mega_kernel_profile(dir=a.profile):  # one window
                        loss, _ = training.optimizer_step(models[key], opts[key], *batch, world)
                else:
                    loss, _ = training.optimizer_step(models[key], opts[key], *batch, world)
                step_losses[i] = loss.double()
            dist.all_reduce(step_losses)
            step_losses /= world
            for key, v in zip(models, step_losses.tolist()):
                losses[key].append(v)
            if rank == 0:
                line = f"step {step + 1}/{a.steps}  " + "  ".join(
                    f"loss {k} {losses[k][-1]:.6f}" for k in models)
                if bar is not None:
                    bar.write(line, file=sys.stdout)
                    bar.set_postfix({k: f"{losses[k][-1]:.4f}" for k in models})
                    bar.update(1)
                else:
                    print(line, flush=True)
            done = step + 1
            if a.checkpoint_dir and (done == a.steps or (a.save_every and done % a.save_every == 0)):
                for key in models:
                    training.save_checkpoint(
                        ckpt_path(step_dir(a.checkpoint_dir, done), key, rank), models[key],
                        opts[key],
                        {"step": done, "losses": losses[key], "config": cfg.__dict__,
                         "world_size": world, "seed": a.seed, "data": a.data})
        if bar is not None:
            bar.close()
        if rank == 0:
            secs = time.perf_counter() - t_run
            print(f"train.py: {a.steps - start} steps in {secs:.1f} s", file=sys.stderr)
            print("train.py: " + summary(losses), file=sys.stderr)
            if a.log:
                with open(a.log, "w") as f:
                    json.dump({"config": cfg.__dict__, "world_size": world, "start": start,
                               "losses": losses}, f)
            if a.plot:
                plot(a.plot, losses, start,
                     f"Qwen-MoE on {len(text.files)} Debian licence texts (bytes): H "
                     f"{cfg.hidden_size}, {cfg.num_layers} layers, E {cfg.num_experts} top-"
                     f"{cfg.top_k}, EP {world}, {cfg.local_num_tokens} tokens/rank/step")
                print(f"train.py: loss curves in {a.plot}", file=sys.stderr)
        if a.profile and "mega_moe" in models:
            dist.barrier()
            if rank == 0:
                megamoe.profiler.render_svg(a.profile, os.path.join(a.profile, "timeline.svg"))
                print(f"train.py: MegaKernel trace of one B step in {a.profile}",
                      file=sys.stderr)
        return 0
    finally:
        for m in models.values():
            m.close()
        if dist.is_initialized():
            dist.barrier()
            dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())
