"""megamoe.layout (C layout helpers through Python) against torch: the seed's rule
gate_up = cat(gate^T, up^T, -1), down_weight = down^T, and the round trips."""
import pytest
import torch

from megamoe import layout


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("shape", [(3, 37, 19), (1, 8, 4), (4, 64, 33)])
def test_layout_matches_torch_and_round_trips(dtype, shape):
    e, h, i = shape
    torch.manual_seed(e * h * i)
    gate = torch.randn(e, i, h).to(dtype)
    up = torch.randn(e, i, h).to(dtype)
    down = torch.randn(e, h, i).to(dtype)
    gu = layout.gate_up_from_linear(gate, up)
    assert gu.shape == (e, h, 2 * i)
    assert torch.equal(gu, torch.cat([gate.transpose(1, 2), up.transpose(1, 2)], dim=-1))
    dw = layout.down_from_linear(down)
    assert torch.equal(dw, down.transpose(1, 2))
    g2, u2 = layout.gate_up_to_linear(gu)
    assert torch.equal(g2, gate) and torch.equal(u2, up)
    assert torch.equal(layout.down_to_linear(dw), down)
    # one expert without the leading dim
    assert torch.equal(layout.gate_up_from_linear(gate[0], up[0]), gu[0])
    assert torch.equal(layout.down_from_linear(down[-1]), dw[-1])


def test_layout_rejects_other_dtypes():
    with pytest.raises(TypeError):
        layout.down_from_linear(torch.zeros(2, 3, 4, dtype=torch.int32))
