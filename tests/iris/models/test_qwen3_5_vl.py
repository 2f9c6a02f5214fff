"""Qwen3.5 and Qwen3.5-MoE image-text models on the vision side: counting equal to HF's
image processor, embeddings equal to HF's get_image_features (no deepstack: one hidden-size
row per token), M-RoPE positions equal to HF's get_rope_index, and what the engine reads
from the config (interleaved M-RoPE on the partial rotary dims, the MoE block)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from iris.models import load_adapter
from iris.multimodal import Modality, MultimodalItem
from llm_svc.engine.models.config import TextModelConfig, UnsupportedModelError
from tests.iris.models.test_qwen3_vl import SIZES, _images

FAMILIES = {"tiny_qwen3_5_vl_dir": "qwen3_5", "tiny_qwen3_5_vl_moe_dir": "qwen3_5_moe"}


@pytest.fixture(scope="module", params=list(FAMILIES))
def model_dir(request):
    return request.getfixturevalue(request.param)


@pytest.fixture(scope="module")
def adapter(model_dir):
    return load_adapter(model_dir)


@pytest.fixture(scope="module")
def hf_model(model_dir):
    from transformers import AutoModelForImageTextToText

    return AutoModelForImageTextToText.from_pretrained(str(model_dir)).eval()


def _processor(model_dir):
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import (
        Qwen2VLImageProcessorPil,
    )

    return Qwen2VLImageProcessorPil.from_pretrained(str(model_dir))


def test_the_registry_and_the_engine_config_name_each_family(adapter, model_dir):
    moe = adapter.architecture == "Qwen3_5MoeForConditionalGeneration"
    assert adapter.text_family == ("qwen3_5_moe" if moe else "qwen3_5")
    assert adapter.deepstack_levels == 0 and adapter.embedding_width == adapter.hidden_size
    config = TextModelConfig.from_model_dir(model_dir)
    assert config.is_hybrid and config.deepstack_levels == 0
    assert config.mrope_section == (2, 1, 1) and config.mrope_interleaved
    assert config.rotary_dim == 8  # head_dim 16 x partial_rotary_factor 0.5
    if moe:
        assert config.moe.num_experts == 4 and config.moe.top_k == 2
        assert config.moe.norm_topk_prob and config.moe.shared_expert_size == 40
        assert all(config.moe.is_sparse(i) for i in range(config.num_layers))
    else:
        assert config.moe is None


def test_counts_equal_the_image_processor(adapter, model_dir):
    processor = _processor(model_dir)
    for (w, h), image in zip(SIZES, _images(SIZES), strict=True):
        grid = processor(images=[image], return_tensors="np")["image_grid_thw"][0]
        count, ours = adapter.image_token_count(w, h)
        assert tuple(ours) == tuple(int(x) for x in grid)
        assert count == int(np.prod(grid)) // 4


def test_runner_equals_hf_image_features(adapter, hf_model, model_dir):
    images = _images(SIZES[:4], seed=1)
    runner = adapter.vision_runner()
    outputs = runner.encode([runner.preprocess(image) for image in images])
    inputs = _processor(model_dir)(images=images, return_tensors="pt")
    with torch.inference_mode():
        ref = hf_model.model.get_image_features(
            inputs["pixel_values"], inputs["image_grid_thw"], return_dict=True
        )
    assert runner.hidden_size == adapter.hidden_size
    assert len(outputs) == len(ref.pooler_output) == 4
    for out, expected in zip(outputs, ref.pooler_output, strict=True):
        assert out.shape == (expected.shape[0], adapter.hidden_size) and out.is_contiguous()
        torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("sizes", [[(64, 64)], [(640, 480), (30, 500)]])
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
    input_ids = torch.tensor([ids])
    expected, expected_delta = hf_model.model.get_rope_index(
        input_ids, (input_ids == adapter.image_token_id).int(), image_grid_thw=torch.tensor(grids)
    )
    np.testing.assert_array_equal(positions, expected[:, 0].numpy())
    assert delta == int(expected_delta)


def _edited(model_dir, tmp_path, edit):
    target = tmp_path
    target.mkdir()
    config = json.loads((model_dir / "config.json").read_text())
    edit(config["text_config"])
    (target / "config.json").write_text(json.dumps(config))
    return target


def test_unsupported_options_are_refused_by_name(tiny_qwen3_5_vl_moe_dir, tmp_path):
    def section(text):
        text["rope_parameters"]["mrope_section"] = [2, 2, 2]

    with pytest.raises(UnsupportedModelError, match="mrope_section"):
        TextModelConfig.from_model_dir(_edited(tiny_qwen3_5_vl_moe_dir, tmp_path / "a", section))

    def dense_layers(text):
        text["mlp_only_layers"] = [0]

    with pytest.raises(UnsupportedModelError, match="mlp_only_layers"):
        TextModelConfig.from_model_dir(
            _edited(tiny_qwen3_5_vl_moe_dir, tmp_path / "b", dense_layers)
        )

    def no_shared(text):
        text["shared_expert_intermediate_size"] = 0

    with pytest.raises(UnsupportedModelError, match="shared_expert_intermediate_size"):
        TextModelConfig.from_model_dir(_edited(tiny_qwen3_5_vl_moe_dir, tmp_path / "c", no_shared))


def test_the_template_renders_images_and_qwen_xml_calls(adapter):
    from iris.models.tool_format import QWEN_XML

    assert adapter.template_renders_tools and adapter.tool_call_format == QWEN_XML
    content = [{"type": "image"}, {"type": "text", "text": "what is it?"}]
    rendered = adapter.apply_chat_template([{"role": "user", "content": content}])
    assert "<|vision_start|><|image_pad|><|vision_end|>what is it?" in rendered
