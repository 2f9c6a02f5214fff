"""M-RoPE positions equal HF's get_rope_index for the same prompt."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from iris.models import load_adapter
from iris.multimodal import Modality, MultimodalItem


@pytest.fixture(scope="module", params=["tiny_qwen2_vl_dir", "tiny_qwen2_5_vl_dir"])
def model_dir(request):
    return request.getfixturevalue(request.param)


@pytest.fixture(scope="module")
def qwen(model_dir):
    return load_adapter(model_dir)


@pytest.fixture(scope="module")
def hf_model(model_dir):
    from transformers import AutoModelForImageTextToText

    return AutoModelForImageTextToText.from_pretrained(str(model_dir)).eval()


def _prompt(qwen, sizes, trailing="and what else?"):
    content = []
    for size in sizes:
        content += [{"type": "text", "text": f"image {size}:"}, {"type": "image"}]
    content.append({"type": "text", "text": trailing})
    prompt = qwen.apply_chat_template([{"role": "user", "content": content}])
    grids = [qwen.image_token_count(*size)[1] for size in sizes]
    ids, spans = qwen.expand_prompt(qwen.encode_prompt(prompt), grids)
    items = []
    for span, grid in zip(spans, grids, strict=True):
        item = MultimodalItem(Modality.IMAGE, offsets=span, grid=grid)
        items.append(item)
    return ids, items, grids


@pytest.mark.parametrize(
    "sizes", [[(64, 64)], [(640, 480), (30, 500)], [(100, 300), (300, 100), (56, 56)], []]
)
def test_positions_equal_hf_get_rope_index(qwen, hf_model, sizes):
    ids, items, grids = _prompt(qwen, sizes)
    positions, delta = qwen.mrope_positions(len(ids), items)
    input_ids = torch.tensor([ids])
    token_types = (input_ids == qwen.image_token_id).int()
    if not grids:
        # HF uses plain 1-D positions without images.
        np.testing.assert_array_equal(positions, np.tile(np.arange(len(ids)), (3, 1)))
        assert delta == 0
        return
    expected, expected_delta = hf_model.model.get_rope_index(
        input_ids, token_types, image_grid_thw=torch.tensor(grids)
    )
    assert positions.dtype == np.int64 and positions.shape == (3, len(ids))
    np.testing.assert_array_equal(positions, expected[:, 0].numpy())
    assert delta == int(expected_delta[0, 0])


def test_span_grid_mismatch_is_refused(qwen):
    item = MultimodalItem(Modality.IMAGE, offsets=[(2, 5)], grid=(1, 4, 8))
    with pytest.raises(ValueError, match=r"has 4 tokens but its grid \(1, 4, 8\) gives 8"):
        qwen.mrope_positions(10, [item])
