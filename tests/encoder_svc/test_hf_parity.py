"""End to end: embeddings encoded by the service and read back through the cache service
equal the HF model's own image-feature path, for both model families."""

from __future__ import annotations

import pytest
import torch

from iris.multimodal import decode_image
from tests.encoder_svc.stack import encode_item, png

SIZES = [(200, 120), (64, 260), (333, 333)]


def _hf_model(family):
    from transformers import AutoImageProcessor, AutoModelForImageTextToText

    model = AutoModelForImageTextToText.from_pretrained(str(family.model_dir)).eval()
    return model, AutoImageProcessor.from_pretrained(str(family.model_dir))


def _hf_features(family, model, processor, image: bytes) -> torch.Tensor:
    """The full HF model's get_image_features on HF's own image processor output."""
    pil = decode_image(image)
    with torch.inference_mode():
        if family.name == "qwen2_vl":
            inputs = processor(images=[pil], return_tensors="pt")
            out = model.get_image_features(
                pixel_values=inputs["pixel_values"], image_grid_thw=inputs["image_grid_thw"]
            )
        else:
            inputs = processor(images=[[pil]], return_tensors="pt")
            out = model.get_image_features(
                pixel_values=inputs["pixel_values"],
                pixel_attention_mask=inputs["pixel_attention_mask"],
            )
    (features,) = out.pooler_output  # one image in, one tensor out
    return features.reshape(-1, features.shape[-1])


@pytest.mark.parametrize("family_name", ["qwen", "idefics"])
async def test_embeddings_match_the_hf_image_features(family_name, request, stack_factory):
    family = request.getfixturevalue(family_name)
    stack = await stack_factory(family, max_wait_ms=50)
    images = [png(60 + index, w, h) for index, (w, h) in enumerate(SIZES)]
    items = [encode_item(family, image) for image in images]
    reply = await stack.encode(items)
    assert [r.ok for r in reply.results] == [True] * len(items)
    assert sum(stack.runner.calls) == len(items)

    requests = [(item.item.identity, item.item.token_count) for item in items]
    stored = await stack.cache_client.get_many(requests, family.adapter.hidden_size, torch.float32)
    model, processor = _hf_model(family)
    for item, image in zip(items, images, strict=True):
        embedding = stored[item.item.identity]
        assert embedding.shape == (item.item.token_count, family.adapter.hidden_size)
        torch.testing.assert_close(
            embedding, _hf_features(family, model, processor, image), atol=1e-5, rtol=1e-4
        )
