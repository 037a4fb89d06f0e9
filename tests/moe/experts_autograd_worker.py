"""One-rank MegaMoeExperts autograd edge cases (run by test_experts_autograd.py in its own
process: the SHMEM runtime is process-wide)."""
import sys

import torch

import megamoe
import megamoe.experts as mex
from megamoe import MegaMoeExperts

T, H, I, E, K = 128, 64, 32, 4, 2


def main(case):
    torch.manual_seed(0)
    m = MegaMoeExperts(T, H, I, E, K).to(dtype=torch.bfloat16)
    x = torch.randn(T, H).bfloat16().requires_grad_()
    ids = torch.randint(0, E, (T, K))
    w = torch.rand(T, K, requires_grad=True)
    if case == "double_backward":
        # another path keeps the first-order grad differentiable, so without a guard the
        # layer's second-order terms would silently count as zero
        out = m(x, ids, w).float() + x.float() ** 2
        g, = torch.autograd.grad(out.sum(), x, create_graph=True)
        assert g.requires_grad
        try:
            (g.float() ** 2).sum().backward()
        except RuntimeError as e:
            assert "double backward" in str(e), e
            print("double backward refused:", e)
        else:
            raise AssertionError("double backward through MegaMoeExperts did not raise")
    elif case == "retain_graph":
        # the saved state lives as long as the graph keeps its saved tensor: a second backward
        # through a retained graph gives the same gradients again
        out = m(x, ids, w)
        out.float().sum().backward(retain_graph=True)
        first = [x.grad.clone(), w.grad.clone(), m.gate_up_weight.grad.clone()]
        out.float().sum().backward()
        for a, b in zip(first, [x.grad, w.grad, m.gate_up_weight.grad]):
            assert torch.equal((2 * a.float()).to(a.dtype), b), "second backward differs"
        print("second backward through a retained graph: equal gradients")
    elif case == "no_grad":
        made = []
        orig = mex._Saved.__init__

        def counting_init(self):
            made.append(1)
            orig(self)

        mex._Saved.__init__ = counting_init
        with torch.no_grad():
            a = m(x, ids, w)
        assert not made, "a forward under torch.no_grad() kept a saved state for backward"
        b = m(x, ids, w)  # grad mode: saved for backward
        assert made and b.requires_grad
        assert torch.equal(a, b.detach())
        b.float().sum().backward()
        assert x.grad is not None and w.grad is not None
    elif case == "replaced_weights":
        # Weights replaced wholesale (`.data = ...`, as checkpoint loading may do) must be used
        # by the next forward, even when the new tensor lands at the freed address of the old
        # one with an equal version counter (large blocks are mmap'd, so a freed address comes
        # straight back): the layer may not keep serving its old packed copy.
        from megamoe import reference
        with torch.no_grad():
            reused = 0
            for _ in range(3):
                m(x, ids, w)  # packs the current weights
                old = (m.gate_up_weight.data_ptr(), m.down_weight.data_ptr())
                shapes = (m.gate_up_weight.shape, m.down_weight.shape)
                m.gate_up_weight.data = torch.empty(0, dtype=torch.bfloat16)
                m.down_weight.data = torch.empty(0, dtype=torch.bfloat16)
                m.gate_up_weight.data = torch.randn(shapes[0], dtype=torch.bfloat16) * 0.05
                m.down_weight.data = torch.randn(shapes[1], dtype=torch.bfloat16) * 0.05
                reused += (m.gate_up_weight.data_ptr(), m.down_weight.data_ptr()) == old
                got = m(x, ids, w).float()
                want = reference.forward(x.detach(), ids, w.detach(), m.gate_up_weight.detach(),
                                         m.down_weight.detach())
                err = ((got - want).norm() / want.norm()).item()
                assert err < 1e-2, f"stale weights: relative error {err:.3g}"
            print("replaced weights; old addresses reused", reused, "times")
    elif case == "non_finite":
        # NaN/Inf inputs and gradients are refused with the element named; the layer goes on
        bad = x.detach().clone()
        bad[3, 9] = float("nan")
        try:
            m(bad, ids, w)
        except megamoe.MegaMoeError as e:
            assert "hidden_states[3][9] is NaN" in str(e), e
            print("NaN input refused:", e)
        else:
            raise AssertionError("a NaN in hidden_states did not raise")
        out = m(x, ids, w)
        try:
            out.backward(torch.full_like(out, float("inf")))
        except megamoe.MegaMoeError as e:
            assert "grad_output[0][0] is +Inf" in str(e), e
            print("Inf gradient refused:", e)
        else:
            raise AssertionError("an Inf grad_output did not raise")
        m(x, ids, w).float().sum().backward()
        assert torch.isfinite(x.grad.float()).all()
    else:
        raise SystemExit(f"unknown case {case}")
    m.close()
    print(f"case {case}: ok")


if __name__ == "__main__":
    main(sys.argv[1])
