"""Qwen3-VL and Qwen3-VL-MoE on the vision side: counting equal to HF's image processor,
embeddings (main and every deepstack level) equal to HF's get_image_features, M-RoPE
positions equal to HF's get_rope_index, and the chat template's Hermes tool calls."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

from iris.models import load_adapter
from iris.multimodal import Modality, MultimodalItem

SIZES = [(100, 60), (300, 200), (50, 400), (64, 64), (1000, 20)]


@pytest.fixture(scope="module", params=["tiny_qwen3_vl_dir", "tiny_qwen3_vl_moe_dir"])
def model_dir(request):
    return request.getfixturevalue(request.param)


@pytest.fixture(scope="module")
def adapter(model_dir):
    return load_adapter(model_dir)


@pytest.fixture(scope="module")
def hf_model(model_dir):
    from transformers import AutoModelForImageTextToText

    return AutoModelForImageTextToText.from_pretrained(str(model_dir)).eval()


def _images(sizes, seed: int = 0) -> list[Image.Image]:
    rng = np.random.default_rng(seed)
    return [Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)) for (w, h) in sizes]


def test_the_registry_names_each_family(adapter):
    assert adapter.deepstack_levels == 2
    assert adapter.embedding_width == 3 * adapter.hidden_size
    family = {"Qwen3VLForConditionalGeneration": "qwen3_vl"}.get(
        adapter.architecture, "qwen3_vl_moe"
    )
    assert adapter.text_family == family


def test_counts_equal_the_image_processor(adapter, model_dir):
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import (
        Qwen2VLImageProcessorPil,
    )

    processor = Qwen2VLImageProcessorPil.from_pretrained(str(model_dir))
    assert processor.patch_size == 16
    for (w, h), image in zip(SIZES, _images(SIZES), strict=True):
        grid = processor(images=[image], return_tensors="np")["image_grid_thw"][0]
        count, ours = adapter.image_token_count(w, h)
        assert tuple(ours) == tuple(int(x) for x in grid)
        assert count == int(np.prod(grid)) // 4


def test_runner_equals_hf_image_features_with_every_deepstack_level(adapter, hf_model):
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import (
        Qwen2VLImageProcessorPil,
    )

    images = _images(SIZES[:4], seed=1)
    runner = adapter.vision_runner()
    outputs = runner.encode([runner.preprocess(image) for image in images])
    inputs = Qwen2VLImageProcessorPil.from_pretrained(str(adapter.model_dir))(
        images=images, return_tensors="pt"
    )
    with torch.inference_mode():
        ref = hf_model.model.get_image_features(
            inputs["pixel_values"], inputs["image_grid_thw"], return_dict=True
        )
    hidden = adapter.hidden_size
    assert runner.hidden_size == adapter.embedding_width
    for index, out in enumerate(outputs):
        main = ref.pooler_output[index]
        levels = [level[index] for level in ref.deepstack_features]
        assert len(levels) == 2
        assert out.shape == (main.shape[0], 3 * hidden) and out.is_contiguous()
        torch.testing.assert_close(out[:, :hidden], main, rtol=1e-5, atol=1e-5)
        for level, expected in enumerate(levels):
            got = out[:, (1 + level) * hidden : (2 + level) * hidden]
            torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
    # The levels are not copies of the main rows: a test that could not fail otherwise.
    assert not torch.allclose(outputs[0][:, :hidden], outputs[0][:, hidden : 2 * hidden])


@pytest.mark.parametrize("sizes", [[(64, 64)], [(640, 480), (30, 500)], []])
def test_positions_equal_hf_get_rope_index(adapter, hf_model, sizes):
    content = []
    for size in sizes:
        content += [{"type": "text", "text": f"image {size}:"}, {"type": "image"}]
    content.append({"type": "text", "text": "and what else?"})
    prompt = adapter.apply_chat_template([{"role": "user", "content": content}])
    grids = [adapter.image_token_count(*size)[1] for size in sizes]
    ids, spans = adapter.expand_prompt(adapter.encode_prompt(prompt), grids)
    items = [
        MultimodalItem(Modality.IMAGE, offsets=span, grid=grid)
        for span, grid in zip(spans, grids, strict=True)
    ]
    positions, delta = adapter.mrope_positions(len(ids), items)
    if not grids:
        np.testing.assert_array_equal(positions, np.tile(np.arange(len(ids)), (3, 1)))
        return
    input_ids = torch.tensor([ids])
    expected, expected_delta = hf_model.model.get_rope_index(
        input_ids, (input_ids == adapter.image_token_id).int(), image_grid_thw=torch.tensor(grids)
    )
    np.testing.assert_array_equal(positions, expected[:, 0].numpy())
    assert delta == int(expected_delta)


def test_the_template_renders_tools_and_calls_as_hermes(adapter):
    assert adapter.template_renders_tools
    tool = {"type": "function", "function": {"name": "get_weather", "parameters": {}}}
    messages = [
        {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "where?"}]},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {"type": "function", "function": {"name": "get_weather", "arguments": '{"c": 1}'}}
            ],
        },
        {"role": "tool", "content": "sunny"},
    ]
    prompt = adapter.apply_chat_template(messages, tools=[tool])
    assert '"name": "get_weather"' in prompt and "<tools>" in prompt
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"c": 1}}\n</tool_call>' in prompt
    assert "<tool_response>\nsunny\n</tool_response>" in prompt
    assert prompt.count("<|vision_start|><|image_pad|><|vision_end|>") == 1
    assert prompt.endswith("<|im_start|>assistant\n")
