"""The vision runner equals the HF model's own image-feature path, batch for batch, and
needs only the vision tower + projector weights."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
import torch
from PIL import Image

from iris.models import load_adapter

SIZES = [(100, 60), (300, 200), (50, 400), (64, 64)]


def _images(seed: int = 0) -> list[Image.Image]:
    rng = np.random.default_rng(seed)
    return [Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)) for (w, h) in SIZES]


def _hf_model(model_dir):
    from transformers import AutoModelForImageTextToText

    return AutoModelForImageTextToText.from_pretrained(str(model_dir)).eval()


def _check_outputs(adapter, outputs, references):
    assert len(outputs) == len(references) == len(SIZES)
    for size, out, ref in zip(SIZES, outputs, references, strict=True):
        assert out.shape == (adapter.image_token_count(*size)[0], adapter.hidden_size)
        assert out.is_contiguous() and out.dtype == torch.float32
        torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    # Each image owns its storage (the encoder stores them one by one).
    assert len({out.untyped_storage().data_ptr() for out in outputs}) == len(outputs)


@pytest.mark.parametrize("fixture", ["tiny_qwen2_vl_dir", "tiny_qwen2_5_vl_dir"])
def test_qwen_runner_equals_hf_get_image_features(fixture, request):
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import (
        Qwen2VLImageProcessorPil,
    )

    tiny_qwen2_vl_dir = request.getfixturevalue(fixture)
    adapter = load_adapter(tiny_qwen2_vl_dir)
    runner = adapter.vision_runner()
    images = _images()
    outputs = runner.encode([runner.preprocess(image) for image in images])

    processed = Qwen2VLImageProcessorPil.from_pretrained(str(tiny_qwen2_vl_dir))(
        images=images, return_tensors="pt"
    )
    with torch.no_grad():
        references = (
            _hf_model(tiny_qwen2_vl_dir)
            .model.get_image_features(processed["pixel_values"], processed["image_grid_thw"])
            .pooler_output
        )
    _check_outputs(adapter, outputs, references)


def test_idefics_runner_equals_hf_get_image_features(tiny_idefics3_dir):
    from transformers import Idefics3Processor

    adapter = load_adapter(tiny_idefics3_dir)
    runner = adapter.vision_runner()
    images = _images(1)
    outputs = runner.encode([runner.preprocess(image) for image in images])

    # The HF path: the processor pads the batch to the most tiles; the model drops padding.
    processor = Idefics3Processor.from_pretrained(str(tiny_idefics3_dir))
    processed = processor.image_processor(images=[[image] for image in images], return_tensors="pt")
    with torch.no_grad():
        references = (
            _hf_model(tiny_idefics3_dir)
            .model.get_image_features(processed["pixel_values"], processed["pixel_attention_mask"])
            .pooler_output
        )
    _check_outputs(adapter, outputs, references)


def test_batch_equals_one_by_one(tiny_idefics3_dir):
    runner = load_adapter(tiny_idefics3_dir).vision_runner()
    prepared = [runner.preprocess(image) for image in _images(2)]
    together = runner.encode(prepared)
    for item, batched in zip(prepared, together, strict=True):
        torch.testing.assert_close(runner.encode([item])[0], batched, rtol=1e-5, atol=1e-5)
    assert runner.encode([]) == []


@pytest.mark.parametrize(
    "fixture", ["tiny_qwen2_vl_dir", "tiny_qwen2_5_vl_dir", "tiny_idefics3_dir"]
)
def test_runner_loads_without_language_model_weights(fixture, request, tmp_path):
    from safetensors.torch import load_file, save_file

    model_dir = request.getfixturevalue(fixture)
    adapter = load_adapter(model_dir)
    stripped = tmp_path / "vision-only"
    shutil.copytree(model_dir, stripped)
    tensors = load_file(str(model_dir / "model.safetensors"))
    kept = {k: v for k, v in tensors.items() if not k.startswith(adapter.text_weight_prefix)}
    kept.pop("lm_head.weight")
    assert len(kept) < len(tensors)
    save_file(kept, str(stripped / "model.safetensors"))

    image = _images(3)[1]
    full = adapter.vision_runner()
    alone = load_adapter(stripped).vision_runner()
    torch.testing.assert_close(
        alone.encode([alone.preprocess(image)])[0], full.encode([full.preprocess(image)])[0]
    )


def test_runner_dtype(tiny_qwen2_vl_dir):
    runner = load_adapter(tiny_qwen2_vl_dir).vision_runner(dtype=torch.bfloat16)
    (out,) = runner.encode([runner.preprocess(_images()[0])])
    assert out.dtype == torch.bfloat16 and out.shape[1] == runner.hidden_size
