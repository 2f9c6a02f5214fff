"""The rotary embedding's interleaved M-RoPE option against transformers' own Qwen3-VL
rotary module, on the published head size and sections and on the tiny checkpoint's; and
the block layout (Qwen2-VL) still differs from it, so the option is what makes them equal."""

from __future__ import annotations

import pytest
import torch

from llm_svc.engine.models.layers import RotaryEmbedding


@pytest.mark.parametrize(("head_dim", "section"), [(128, (24, 20, 20)), (16, (4, 2, 2))])
def test_interleaved_bands_equal_transformers(head_dim, section):
    from transformers.models.qwen3_vl.configuration_qwen3_vl import Qwen3VLTextConfig
    from transformers.models.qwen3_vl.modeling_qwen3_vl import Qwen3VLTextRotaryEmbedding

    theta = 5_000_000.0
    config = Qwen3VLTextConfig(
        hidden_size=head_dim * 2, num_attention_heads=2, head_dim=head_dim,
        rope_parameters={"rope_type": "default", "rope_theta": theta,
                         "mrope_section": list(section), "mrope_interleaved": True},
    )  # fmt: skip
    hf = Qwen3VLTextRotaryEmbedding(config)
    positions = torch.stack([torch.arange(40), torch.arange(40) % 7, torch.arange(40) // 3])
    expected_cos, expected_sin = hf(torch.zeros(1, dtype=torch.float32), positions[:, None, :])

    ours = RotaryEmbedding(head_dim, theta, section, mrope_interleaved=True)
    cos, sin = ours(positions, torch.float32)
    torch.testing.assert_close(cos, expected_cos[0], rtol=0, atol=1e-6)
    torch.testing.assert_close(sin, expected_sin[0], rtol=0, atol=1e-6)

    blocks, _ = RotaryEmbedding(head_dim, theta, section)(positions, torch.float32)
    assert (blocks - expected_cos[0]).abs().max() > 1e-2
