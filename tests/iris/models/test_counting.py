"""Token counts from the image size alone equal what the real HF image processors produce.

Qwen2VLProcessor cannot be built here (it needs torchvision, which does not import beside
this CPU torch), so the Qwen2-VL side compares with Qwen2VLImageProcessorPil's
`image_grid_thw` and the documented rule: token_count = t * h * w / merge_size**2 (the
number of <|image_pad|> the processor writes). The Idefics3 side compares with the image
processor's tile rows/cols and, in test_expand.py, with Idefics3Processor's full prompt.
"""

from __future__ import annotations

import io

import pytest
from PIL import Image

from iris.models import load_adapter
from iris.models.idefics3.counting import TileRule
from iris.models.qwen2_vl.counting import QwenImageRule
from iris.multimodal import decode_image, read_image_header

# (width, height): tiny, small, odd, around the factor, large, huge, extreme aspect ratios.
SIZES = [
    (1, 1),
    (2, 3),
    (13, 7),
    (27, 29),
    (28, 28),
    (29, 57),
    (56, 56),
    (64, 64),
    (65, 63),
    (100, 100),
    (223, 225),
    (333, 777),
    (640, 480),
    (480, 640),
    (1024, 768),
    (1280, 720),
    (1920, 1080),
    (2048, 1),
    (1, 190),
    (3000, 16),
    (17, 3100),
    (4000, 3000),
    (6000, 4000),
    (5000, 5000),
]
QWEN2_VL_2B = {
    "min_pixels": 3136,
    "max_pixels": 12845056,
    "patch_size": 14,
    "temporal_patch_size": 2,
    "merge_size": 2,
}
SMOLVLM_256M = {"size": {"longest_edge": 2048}, "max_image_size": {"longest_edge": 512}}
IDEFICS3_8B = {"size": {"longest_edge": 1456}, "max_image_size": {"longest_edge": 364}}


def _qwen_processor(preprocessor: dict):
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import (
        Qwen2VLImageProcessorPil,
    )

    return Qwen2VLImageProcessorPil(**preprocessor)


def _idefics_processor(preprocessor: dict):
    from transformers.models.idefics3.image_processing_pil_idefics3 import (
        Idefics3ImageProcessorPil,
    )

    return Idefics3ImageProcessorPil(**preprocessor)


def _hf_qwen(processor, image: Image.Image) -> tuple[int, tuple[int, ...]]:
    grid = tuple(int(x) for x in processor(images=[image])["image_grid_thw"][0])
    return grid[0] * grid[1] * grid[2] // processor.merge_size**2, grid


def _hf_idefics_grid(processor, image: Image.Image) -> tuple[int, int]:
    out = processor(images=[image], return_row_col_info=True)
    rows, cols = out["rows"][0][0], out["cols"][0][0]
    assert len(out["pixel_values"][0]) == rows * cols + 1
    return rows, cols


@pytest.fixture(scope="module")
def qwen(tiny_qwen2_vl_dir):
    return load_adapter(tiny_qwen2_vl_dir)


@pytest.fixture(scope="module")
def idefics(tiny_idefics3_dir):
    return load_adapter(tiny_idefics3_dir)


def test_qwen_counts_match_image_processor_on_tiny_checkpoint(qwen):
    processor = _qwen_processor(qwen.preprocessor)
    for width, height in SIZES:
        if max(width, height) / min(width, height) > 200:
            continue  # refused by both; see test_qwen_refuses_extreme_aspect_ratio
        expected = _hf_qwen(processor, Image.new("RGB", (width, height), (90, 120, 30)))
        assert qwen.image_token_count(width, height) == expected, (width, height)


def test_qwen_counts_match_with_real_qwen2_vl_defaults():
    rule = QwenImageRule.from_preprocessor(QWEN2_VL_2B)
    processor = _qwen_processor(QWEN2_VL_2B)
    # Real defaults allow ~12.8 MP: the processor's output grows with the image, so huge
    # sizes stay with the tiny checkpoint's limits above.
    for width, height in [s for s in SIZES if s[0] * s[1] <= 2_100_000 and max(s) / min(s) <= 200]:
        expected = _hf_qwen(processor, Image.new("RGB", (width, height)))
        assert rule.count(width, height) == expected, (width, height)


def test_qwen_refuses_extreme_aspect_ratio(qwen):
    with pytest.raises(ValueError, match="aspect ratio 201.0 .* limit of 200"):
        qwen.image_token_count(201, 1)
    with pytest.raises(ValueError):
        _qwen_processor(qwen.preprocessor)(images=[Image.new("RGB", (201, 1))])


def test_idefics_counts_match_image_processor_on_tiny_checkpoint(idefics):
    processor = _idefics_processor(idefics.preprocessor)
    for width, height in SIZES:
        rows, cols = _hf_idefics_grid(processor, Image.new("RGB", (width, height), (200, 10, 10)))
        count, grid = idefics.image_token_count(width, height)
        assert grid == (rows, cols), (width, height)
        assert count == idefics.image_seq_len * (rows * cols + 1)


@pytest.mark.parametrize("preprocessor", [SMOLVLM_256M, IDEFICS3_8B], ids=["smolvlm", "idefics3"])
def test_idefics_counts_match_with_real_defaults(preprocessor):
    rule = TileRule.from_preprocessor(preprocessor)
    processor = _idefics_processor(preprocessor)
    # Every image is first resized to the longest edge (2048 for SmolVLM), so each costs the
    # same here: a spread of ten sizes is enough on top of the 24 checked above.
    for width, height in SIZES[::3] + [(1920, 1080)]:
        assert rule.rows_cols(width, height) == _hf_idefics_grid(
            processor, Image.new("RGB", (width, height))
        ), (width, height)


def _exif_jpeg(width: int, height: int, orientation: int) -> bytes:
    image = Image.new("RGB", (width, height), (10, 200, 50))
    exif = Image.Exif()
    exif[0x0112] = orientation
    buffer = io.BytesIO()
    image.save(buffer, format="JPEG", exif=exif)
    return buffer.getvalue()


@pytest.mark.parametrize("orientation", [1, 3, 6, 8])
def test_exif_rotated_images_count_from_header(qwen, idefics, orientation):
    data = _exif_jpeg(300, 90, orientation)
    header = read_image_header(data)
    decoded = decode_image(data)  # what the encoder feeds the processor: rotated pixels
    assert decoded.size == (header.width, header.height)
    if orientation in (6, 8):
        assert (header.width, header.height) == (90, 300)
    assert qwen.image_token_count(header.width, header.height) == _hf_qwen(
        _qwen_processor(qwen.preprocessor), decoded
    )
    rows_cols = _hf_idefics_grid(_idefics_processor(idefics.preprocessor), decoded)
    assert idefics.image_token_count(header.width, header.height)[1] == rows_cols


def test_sizes_cover_the_required_range():
    assert len(SIZES) >= 20
    assert any(w * h >= 20_000_000 for w, h in SIZES)
    assert any(max(w, h) / min(w, h) >= 150 for w, h in SIZES)


def test_zero_size_is_refused(qwen, idefics):
    for adapter in (qwen, idefics):
        with pytest.raises(ValueError, match="0x5"):
            adapter.image_token_count(0, 5)
