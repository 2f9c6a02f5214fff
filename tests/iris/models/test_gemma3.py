"""Gemma 3's adapter against HF's own processor: image counts from the size alone over
many sizes with pan-and-scan on and off, and the prompt expansion token for token."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from PIL import Image

from iris.models import load_adapter
from iris.models.gemma3.counting import PanAndScanRule

SETTINGS = dict(
    pan_and_scan_min_crop_size=32,
    pan_and_scan_max_num_crops=3,
    pan_and_scan_min_ratio_to_activate=1.2,
)


def _sizes() -> list[tuple[int, int]]:
    """240 sizes: squares, near-squares at the activation ratio, wide and tall strips,
    tiny pictures below the crop size, and random ones."""
    rng = np.random.default_rng(0)
    sizes = [(s, s) for s in (1, 2, 31, 32, 63, 64, 65, 100)]
    sizes += [(w, 100) for w in (119, 120, 121, 149, 150, 151, 249, 250, 251, 349, 350, 351)]
    sizes += [(100, h) for h in (119, 120, 121, 149, 150, 151, 249, 250, 251, 349, 350, 351)]
    sizes += [(w, h) for w, h in [(33, 10), (70, 20), (200, 31), (31, 200), (64, 32), (96, 32)]]
    while len(sizes) < 240:
        sizes.append((int(rng.integers(1, 420)), int(rng.integers(1, 420))))
    return sizes


@pytest.mark.parametrize("pan_and_scan", [False, True], ids=["plain", "pan-and-scan"])
def test_counts_equal_the_image_processor(pan_and_scan):
    from transformers.models.gemma3.image_processing_pil_gemma3 import Gemma3ImageProcessorPil

    processor = Gemma3ImageProcessorPil(
        size={"height": 16, "width": 16}, do_pan_and_scan=pan_and_scan, **SETTINGS
    )
    rule = PanAndScanRule(
        enabled=pan_and_scan,
        min_crop_size=SETTINGS["pan_and_scan_min_crop_size"],
        max_num_crops=SETTINGS["pan_and_scan_max_num_crops"],
        min_ratio_to_activate=SETTINGS["pan_and_scan_min_ratio_to_activate"],
    )
    sizes = _sizes()
    images = [Image.new("RGB", size) for size in sizes]
    crops = processor(images=images, return_tensors="np")["num_crops"]
    got = [rule.num_crops(width, height) for width, height in sizes]
    assert got == [int(c) for c in np.asarray(crops).reshape(-1)]
    if pan_and_scan:
        assert set(got) == {0, 2, 3}  # none, two, and the cap of three are all exercised
    else:
        assert set(got) == {0}


def test_null_settings_take_the_processor_defaults():
    rule = PanAndScanRule.from_preprocessor({"do_pan_and_scan": None})
    assert rule == PanAndScanRule(False, 256, 4, 1.2)


@pytest.mark.parametrize("pan_and_scan", [False, True], ids=["plain", "pan-and-scan"])
def test_expansion_equals_the_processor(tiny_gemma3_dir, pan_and_scan):
    """The chat prompt's ids expanded by the adapter equal Gemma3Processor's input_ids for
    the rendered text, and the spans are exactly its token_type_ids."""
    from transformers import AutoProcessor

    adapter = load_adapter(tiny_gemma3_dir)
    adapter.__dict__["rule"] = dataclasses.replace(adapter.rule, enabled=pan_and_scan)
    processor = AutoProcessor.from_pretrained(str(tiny_gemma3_dir))
    images = [Image.new("RGB", (100, 40)), Image.new("RGB", (50, 70)), Image.new("RGB", (9, 9))]
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": [{"type": "text", "text": "Look"}, {"type": "image"}]},
        {"role": "assistant", "content": "Yes."},
        {
            "role": "user",
            "content": [{"type": "image"}, {"type": "text", "text": "and"}, {"type": "image"}],
        },
    ]
    text = adapter.apply_chat_template(messages)
    hf = processor(
        text=text,
        images=[images],
        do_pan_and_scan=pan_and_scan,
        **SETTINGS,
        return_tensors="np",
    )
    grids = [adapter.image_token_count(im.width, im.height)[1] for im in images]
    expanded, spans = adapter.expand_prompt(adapter.chat_prompt_ids(messages), grids)
    assert expanded == hf["input_ids"][0].tolist()
    marked = np.flatnonzero(hf["token_type_ids"][0]).tolist()
    assert [i for image in spans for s, e in image for i in range(s, e + 1)] == marked
    counts = [adapter.image_token_count(im.width, im.height)[0] for im in images]
    assert sum(counts) == len(marked)
    assert (sum(g[0] for g in grids) > 0) == pan_and_scan


def test_make_tiny_tokenizer_carries_the_processor_tokens(tiny_gemma3_dir):
    from transformers import AutoProcessor

    processor = AutoProcessor.from_pretrained(str(tiny_gemma3_dir))
    tokenizer = processor.tokenizer
    adapter = load_adapter(tiny_gemma3_dir)
    assert tokenizer.boi_token == "<start_of_image>" and tokenizer.eoi_token == "<end_of_image>"
    assert tokenizer.image_token_id == adapter.image_token_id
    assert adapter.placeholder_id == tokenizer.boi_token_id
