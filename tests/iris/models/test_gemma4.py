"""Gemma 4's counting and prompt layout: soft tokens per image equal the processor's
arithmetic over tall, wide, tiny and huge sizes at every budget it offers, and the PIL image
processor's own count on real images; each image expands to boi + N soft tokens + eoi, one
span."""

from __future__ import annotations

import itertools
import subprocess
import sys

import numpy as np
import pytest
from PIL import Image

from iris.models import load_adapter
from iris.models.gemma4.counting import SUPPORTED_SOFT_TOKENS, SoftTokenRule

SIDES = (1, 2, 3, 5, 7, 16, 31, 47, 48, 49, 95, 100, 127, 224, 333, 480, 512, 640, 777,
         1000, 1024, 1920, 2048, 3000, 4096, 8000, 10_000, 50_000)  # fmt: skip


@pytest.mark.parametrize("budget", SUPPORTED_SOFT_TOKENS)
def test_counts_equal_the_processor_arithmetic_over_the_sweep(budget):
    from transformers.models.gemma4.image_processing_pil_gemma4 import (
        get_aspect_ratio_preserving_size,
    )

    rule = SoftTokenRule(max_soft_tokens=budget)
    sizes = list(itertools.product(SIDES, SIDES))
    assert len(sizes) >= 300
    for width, height in sizes:
        target_h, target_w = get_aspect_ratio_preserving_size(
            height=height, width=width, patch_size=16, max_patches=budget * 9,
            pooling_kernel_size=3,
        )  # fmt: skip
        # The processor's own count (Gemma4Processor._get_num_multimodal_tokens).
        want = (target_h // 16) * (target_w // 16) // 9
        assert rule.target_size(width, height) == (target_w, target_h), (width, height)
        assert rule.count(width, height) == want, (width, height, budget)


def test_a_budget_the_processor_does_not_offer_is_refused():
    with pytest.raises(ValueError, match="max_soft_tokens=100"):
        SoftTokenRule(max_soft_tokens=100)


def test_counts_equal_the_pil_image_processor_on_images(tiny_gemma4_dir):
    from transformers.models.gemma4.image_processing_pil_gemma4 import (
        Gemma4ImageProcessorPil,
    )

    adapter = load_adapter(tiny_gemma4_dir)
    processor = Gemma4ImageProcessorPil.from_pretrained(str(tiny_gemma4_dir))
    rng = np.random.default_rng(0)
    for width, height in ((1, 1), (3, 500), (500, 3), (64, 64), (97, 41), (300, 1200)):
        pixels = rng.integers(0, 256, (height, width, 3), dtype=np.uint8)
        out = processor(images=[Image.fromarray(pixels)], return_tensors="np")
        count, grid = adapter.image_token_count(width, height)
        assert count == int(out["num_soft_tokens_per_image"][0]) == grid[0] * grid[1]


def test_an_image_expands_to_boi_soft_tokens_eoi(tiny_gemma4_dir):
    adapter = load_adapter(tiny_gemma4_dir)
    tokenizer = adapter.tokenizer()
    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Hi"}]}]
    ids = adapter.chat_prompt_ids(messages)
    count, grid = adapter.image_token_count(80, 48)
    expanded, spans = adapter.expand_prompt(ids, [grid])
    # Gemma4Processor.replace_image_token: boi + N image tokens + eoi.
    text = tokenizer.decode(ids).replace("<|image|>", "<|image>" + "<|image|>" * count + "<image|>")
    assert expanded == tokenizer(text, add_special_tokens=False)["input_ids"]
    ((start, end),) = spans[0]
    assert end - start + 1 == count and expanded[start - 1] == adapter.marker_ids[0]
    assert expanded[end + 1] == adapter.marker_ids[1]


def test_the_gateway_counts_and_expands_without_torch(tiny_gemma4_dir):
    code = f"""
import sys
from iris.models import load_adapter
adapter = load_adapter({str(tiny_gemma4_dir)!r})
count, grid = adapter.image_token_count(640, 480)
ids = adapter.chat_prompt_ids([{{"role": "user", "content": [{{"type": "image"}}]}}])
expanded, spans = adapter.expand_prompt(ids, [grid])
assert spans[0][0][1] - spans[0][0][0] + 1 == count
sys.exit(1 if "torch" in sys.modules else 0)
"""
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
