"""InternVL3.5 (-HF layout): the tiling choice and token count from the header equal
InternVLProcessor's on a sweep of sizes, the prompt expansion is the processor's, the vision
runner equals HF's image-feature path, and the options Iris does not serve are refused by
name (at load: gateway, encoder and engine alike)."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch
from PIL import Image

from iris.models import UnsupportedModelError, load_adapter, text_family
from iris.models.internvl.counting import TilingRule
from iris.models.internvl.tiny import load_processor

TILE = 448


def _sweep() -> list[tuple[int, int]]:
    """>= 200 (width, height): extreme aspect ratios, tiny, huge, exact tile multiples, and
    a seeded spread of ordinary sizes."""
    sizes = {(1, 1), (1, 5000), (5000, 1), (2, 3), (13, 7), (20000, 20000), (16384, 9)}
    sizes |= {(TILE * c, TILE * r) for c in range(1, 13) for r in range(1, 13) if c * r <= 14}
    sizes |= {(TILE * c + d, TILE * r) for c, r in ((1, 1), (2, 1), (3, 4)) for d in (-1, 1)}
    sizes |= {(w, 1) for w in (2, 7, 100, 999)} | {(1, h) for h in (3, 50, 4000)}
    rng = np.random.default_rng(52)
    while len(sizes) < 260:
        sizes.add((int(rng.integers(1, 6000)), int(rng.integers(1, 6000))))
    return sorted(sizes)


SIZES = _sweep()


def test_the_sweep_covers_what_the_issue_asks():
    assert len(SIZES) >= 200
    assert any(max(w, h) / min(w, h) >= 1000 for w, h in SIZES)
    assert any(w * h >= 100_000_000 for w, h in SIZES) and (1, 1) in SIZES
    assert sum(w % TILE == 0 and h % TILE == 0 for w, h in SIZES) >= 30


@pytest.mark.parametrize("max_patches", [12, 6, 1])
def test_counts_equal_the_processor_on_the_sweep_with_published_settings(
    tiny_internvl_dir, tmp_path, max_patches
):
    """The published InternVL3.5 settings (448 px tiles, 1 to 12 patches; and others)."""
    model_dir = tmp_path / "model"
    shutil.copytree(tiny_internvl_dir, model_dir)
    path = model_dir / "preprocessor_config.json"
    preprocessor = json.loads(path.read_text())
    preprocessor |= {"size": {"height": TILE, "width": TILE}, "max_patches": max_patches}
    path.write_text(json.dumps(preprocessor))
    config = json.loads((model_dir / "config.json").read_text())
    config["vision_config"] |= {"image_size": [TILE, TILE], "patch_size": [14, 14]}
    config["image_seq_length"] = 256
    (model_dir / "config.json").write_text(json.dumps(config))
    (model_dir / "processor_config.json").write_text(json.dumps({"image_seq_length": 256}))
    adapter = load_adapter(model_dir)
    processor = load_processor(model_dir)
    hw = [(h, w) for w, h in SIZES]
    expected = processor._get_num_multimodal_tokens(image_sizes=hw)
    for (width, height), tokens, patches in zip(
        SIZES, expected["num_image_tokens"], expected["num_image_patches"], strict=True
    ):
        count, (rows, columns) = adapter.image_token_count(width, height)
        # The processor counts <img> and </img> too; Iris's count is the embedding rows.
        assert (count + 2, count // 256) == (tokens, patches), (width, height)
        assert rows * columns <= max_patches


def test_counts_and_expansion_equal_the_processor_on_real_pixels(tiny_internvl_dir):
    adapter = load_adapter(tiny_internvl_dir)
    processor = load_processor(tiny_internvl_dir)
    runner = adapter.vision_runner()
    for width, height in [(1, 1), (64, 64), (128, 64), (64, 640), (700, 3), (150, 97)]:
        image = Image.new("RGB", (width, height), (width % 256, height % 256, 7))
        text = "<|im_start|>user\nSee <IMG_CONTEXT>\nthis<|im_end|>\n"
        out = processor(images=[image], text=[text], return_tensors="np")
        count, grid = adapter.image_token_count(width, height)
        ids, spans = adapter.expand_prompt(adapter.encode_prompt(text), [grid])
        assert ids == out["input_ids"][0].tolist()
        assert [end - start + 1 for start, end in spans[0]] == [count]
        prepared = runner.preprocess(image)
        assert (prepared.token_count, prepared.grid) == (count, grid)
        assert np.array_equal(prepared.pixel_values.numpy(), out["pixel_values"])


def test_tiling_rule_prefers_more_tiles_on_a_tie_only_for_large_images():
    rule = TilingRule(TILE, TILE, 1, 12)
    assert rule.grid(TILE, TILE) == (1, 1)  # (1,1), (2,2), (3,3) tie: area not > half of 2x2
    assert rule.grid(3 * TILE, 3 * TILE) == (3, 3)
    assert rule.num_tiles(TILE, TILE) == 1 and rule.num_tiles(2 * TILE, TILE) == 3


def _images(sizes, seed=0):
    rng = np.random.default_rng(seed)
    return [Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)) for w, h in sizes]


def test_runner_equals_hf_get_image_features(tiny_internvl_dir):
    from transformers import AutoModelForImageTextToText

    adapter = load_adapter(tiny_internvl_dir)
    runner = adapter.vision_runner()
    sizes = [(64, 64), (150, 60), (40, 300)]
    images = _images(sizes)
    outputs = runner.encode([runner.preprocess(image) for image in images])
    pixels = load_processor(tiny_internvl_dir).image_processor(
        images=images, crop_to_patches=True, return_tensors="pt"
    )["pixel_values"]
    model = AutoModelForImageTextToText.from_pretrained(str(tiny_internvl_dir)).eval()
    with torch.no_grad():
        reference = model.model.get_image_features(pixel_values=pixels).pooler_output
    reference = reference.reshape(-1, reference.shape[-1]).split(
        [adapter.image_token_count(*size)[0] for size in sizes]
    )
    for out, ref in zip(outputs, reference, strict=True):
        torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    assert len({out.untyped_storage().data_ptr() for out in outputs}) == len(outputs)


def _edited(src, tmp_path, **changes):
    model_dir = tmp_path / "edited"
    shutil.copytree(src, model_dir)
    config = json.loads((model_dir / "config.json").read_text())
    for key, value in changes.items():
        if key == "text_model_type":
            config["text_config"]["model_type"] = value
        elif key == "architectures":
            config["architectures"] = value
        else:
            config[key] = value
    (model_dir / "config.json").write_text(json.dumps(config))
    return model_dir, config


@pytest.mark.parametrize(
    ("change", "named"),
    [
        ({"architectures": ["InternVLChatModel"]}, "InternVLChatModel"),
        ({"text_model_type": "gpt_oss"}, "GPT-OSS"),
        ({"vision_feature_layer": [-1, -2]}, "vision_feature_layer"),
        ({"vision_feature_select_strategy": "full"}, "vision_feature_select_strategy"),
    ],
)
def test_refused_by_name_at_load(tiny_internvl_dir, tmp_path, change, named):
    from llm_svc.engine.models.config import TextModelConfig
    from llm_svc.engine.models.config import UnsupportedModelError as Engine

    model_dir, config = _edited(tiny_internvl_dir, tmp_path, **change)
    with pytest.raises(UnsupportedModelError, match=named):
        load_adapter(model_dir)  # the gateway and the encoder
    with pytest.raises(Engine, match=named):
        TextModelConfig.from_model_dir(model_dir)  # the engine
    with pytest.raises(UnsupportedModelError, match=named):
        text_family(config["architectures"][0], config)


def test_language_model_family_follows_the_text_config(tiny_internvl_dir, tiny_internvl_moe_dir):
    from llm_svc.engine.models.config import TextModelConfig

    assert TextModelConfig.from_model_dir(tiny_internvl_dir).family == "qwen3"
    assert TextModelConfig.from_model_dir(tiny_internvl_moe_dir).family == "qwen3_moe"


def test_chat_is_qwen3s_with_thinking(tiny_internvl_dir):
    adapter = load_adapter(tiny_internvl_dir)
    assert adapter.reasoning is not None and adapter.reasoning.takes_enable_thinking
    assert adapter.reasoning.thinks_by_default
    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Hi"}]}]
    off = adapter.apply_chat_template(messages, template_kwargs={"enable_thinking": False})
    assert off.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert "<IMG_CONTEXT>" in off
