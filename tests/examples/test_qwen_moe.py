"""examples/qwen_moe: the A/B benchmark's first-step accuracy on 2 ranks (and that it fails when
B is wrong), the config rules, and train.py's checkpoint resume being bit-identical."""
import json
import os
import subprocess
import sys

import pytest

from conftest import BUILD, MEGAMOE, REPO

EXAMPLE = os.path.join(REPO, "examples", "qwen_moe")
PY = "/usr/bin/python3"
SMALL = ["--hidden", "128", "--heads", "4", "--kv-heads", "2", "--seq-len", "128", "--batch", "1",
         "--experts", "4", "--top-k", "2", "--intermediate", "64", "--shared-intermediate", "64"]
KEYS = {"config", "accuracy", "median_step_ms", "speedup", "moe_ms", "moe_speedup",
        "moe_share", "versions"}


def _env():
    env = dict(os.environ, MEGAMOE_BUILD_DIR=BUILD, OMP_NUM_THREADS="1")
    env["PYTHONPATH"] = os.path.join(REPO, "python") + os.pathsep + env.get("PYTHONPATH", "")
    return env


def launch(n, script, *args, timeout=180):
    cmd = [MEGAMOE, "launch", "-n", str(n), "--timeout", str(timeout - 10), "--", PY,
           os.path.join(EXAMPLE, script), *args]
    return subprocess.run(cmd, capture_output=True, text=True, env=_env(), timeout=timeout)


@pytest.mark.parametrize("capacity", ["lossless", "push-growing"])
def test_benchmark_first_step_accuracy_two_ranks(megamoe_bin, tmp_path, capacity):
    out = tmp_path / "result.json"
    extra = ["--fp32-reference"] if capacity == "lossless" else [
        "--dispatch-mode", "push", "--initial-capacity-factor", "1", "--capacity-growth-factor",
        "1"]
    r = launch(2, "benchmark.py", *SMALL, "--layers", "2", "--accuracy-only", "--output",
               str(out), *extra)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    result = json.loads(out.read_text())
    # the same object is the one line rank 0 printed on stdout
    printed = [l[len("[rank 0] "):] for l in r.stdout.splitlines() if l.startswith("[rank 0] {")]
    assert len(printed) == 1 and json.loads(printed[0]) == result
    assert not [l for l in r.stdout.splitlines() if l.startswith("[rank 1]")]
    assert set(result) == KEYS
    acc = result["accuracy"]
    assert acc["passed"] is True
    names = [t["name"] for t in acc["tensors"]]
    assert names[:3] == ["initial parameters", "loss", "logits"]
    # every parameter twice (local gradient, value after the AdamW step): 2 layers x 12 + 3
    assert sum(n.startswith("grad.") for n in names) == 27
    assert sum(n.startswith("param.") for n in names) == 27
    assert "grad.layers.1.mlp.experts.gate_up_weight" in names
    assert all(t["passed"] for t in acc["tensors"])
    assert result["config"]["ep_size"] == 2 and result["config"]["local_num_tokens"] == 128
    assert result["median_step_ms"] is None and result["speedup"] is None  # --accuracy-only
    if capacity == "lossless":  # both bf16 models measured against the fp32 one
        vs32 = [t["rel_l2_vs_fp32"] for t in acc["tensors"] if "rel_l2" in t]
        assert len(vs32) == 56 and all(0 <= v["mega_moe"] < 0.05 for v in vs32), vs32
    experts = result["config"]["mega_moe_experts"]
    if capacity == "push-growing":  # T*K rows to start with; the routing needs more
        assert experts["dispatch_mode"] == "push" and experts["growth_events"] >= 1, experts
    else:
        assert experts["capacity"] == 2 * 128 * 2 and experts["growth_events"] == 0, experts


def test_benchmark_fails_when_b_is_wrong(megamoe_bin, tmp_path):
    """One rank, B's experts output 3 % too large: the comparison must say so and exit 1."""
    code = (
        "import sys, megamoe\n"
        f"sys.path.insert(0, {EXAMPLE!r})\n"
        "forward = megamoe.MegaMoeExperts.forward\n"
        "megamoe.MegaMoeExperts.forward = lambda self, *a, **k: forward(self, *a, **k) * 1.03\n"
        "import benchmark\n"
        f"sys.exit(benchmark.main({SMALL + ['--layers', '1', '--accuracy-only']!r}))\n")
    r = subprocess.run([PY, "-c", code], capture_output=True, text=True, env=_env(),
                       timeout=120, cwd=tmp_path)
    assert r.returncode == 1, r.stdout[-3000:] + r.stderr[-3000:]
    result = json.loads(r.stdout.strip().splitlines()[-1])
    assert result["accuracy"]["passed"] is False
    failed = {t["name"] for t in result["accuracy"]["tensors"] if not t["passed"]}
    assert "grad.layers.0.mlp.experts.down_weight" in failed, failed
    assert "accuracy: FAILED" in r.stderr


def test_config_rules():
    sys.path.insert(0, EXAMPLE)
    from model import QwenMoeConfig
    QwenMoeConfig()
    for kwargs, rule in ((dict(seq_len=100), "multiple of 128"),
                         (dict(num_key_value_heads=3), "divisible by num_key_value_heads"),
                         (dict(num_experts=15), "divisible by ep_size"),
                         (dict(top_k=17), "cannot exceed num_experts"),
                         (dict(num_attention_heads=5), "divisible by num_attention_heads"),
                         (dict(expert_capacity_factor=0.5), "expert_capacity_factor"),
                         (dict(hidden_size=0), "positive integer")):
        with pytest.raises(ValueError, match=rule):
            QwenMoeConfig(**kwargs)


def _tensors(x, prefix=""):
    import torch
    if isinstance(x, torch.Tensor):
        yield prefix, x
    elif isinstance(x, dict):
        for k, v in x.items():
            yield from _tensors(v, f"{prefix}/{k}")
    elif isinstance(x, (list, tuple)):
        for i, v in enumerate(x):
            yield from _tensors(v, f"{prefix}/{i}")


def test_train_resume_is_bit_identical(megamoe_bin, tmp_path):
    """6 steps straight vs 3 steps, checkpoint, a new job resuming for 3 more: the same losses
    and, at step 6, the same model (experts included) and optimizer state, bit for bit."""
    import torch
    common = [*SMALL, "--steps", "6"]
    r1 = launch(2, "train.py", *common, "--save-every", "3", "--checkpoint-dir",
                str(tmp_path / "straight"), "--log", str(tmp_path / "straight.json"),
                "--plot", str(tmp_path / "loss.png"))
    assert r1.returncode == 0, r1.stdout[-3000:] + r1.stderr[-3000:]
    assert "step 6/6" in r1.stdout
    r2 = launch(2, "train.py", *common, "--resume", str(tmp_path / "straight" / "step_000003"),
                "--checkpoint-dir", str(tmp_path / "resumed"), "--log",
                str(tmp_path / "resumed.json"))
    assert r2.returncode == 0, r2.stdout[-3000:] + r2.stderr[-3000:]
    assert "step 4/6" in r2.stdout and "step 3/6" not in r2.stdout
    straight = json.loads((tmp_path / "straight.json").read_text())["losses"]
    resumed = json.loads((tmp_path / "resumed.json").read_text())["losses"]
    assert straight == resumed and len(straight["mega_moe"]) == 6
    # B and A train alike (same start, same batches)
    assert all(abs(b - a) < 2e-2 for a, b in zip(straight["common"], straight["mega_moe"]))
    assert (tmp_path / "loss.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    for backend in ("mega_moe", "common"):
        for rank in (0, 1):
            a = torch.load(tmp_path / "straight" / "step_000006" / backend / f"rank{rank}.pt")
            b = torch.load(tmp_path / "resumed" / "step_000006" / backend / f"rank{rank}.pt")
            ta, tb = dict(_tensors(a)), dict(_tensors(b))
            assert ta.keys() == tb.keys()
            assert any("experts" in k for k in ta)
            diff = [k for k in ta if not torch.equal(ta[k], tb[k])]
            assert not diff, (backend, rank, diff[:5])
