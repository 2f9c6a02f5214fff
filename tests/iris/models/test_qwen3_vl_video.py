"""Qwen3-VL video frame groups against transformers (whose video processor needs
torchvision, which does not import here: its own arithmetic and placeholder format are
used instead): patches in the video processor's layout, each group encoded alone equal to
its rows of HF's get_video_features over the whole video (the tower attends within one
group), the prompt expansion in the processor's format, and M-RoPE positions equal to HF's
get_rope_index with video_grid_thw."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from transformers.models.qwen3_vl.video_processing_qwen3_vl import Qwen3VLVideoProcessor

from iris.models import load_adapter
from iris.multimodal import Modality, MultimodalItem
from iris.multimodal.video import VideoLimits, sample_video
from tests.fixtures.videos import encode_video, source_frames


@pytest.fixture(scope="module")
def adapter(tiny_qwen3_vl_dir):
    return load_adapter(tiny_qwen3_vl_dir)


@pytest.fixture(scope="module")
def hf_model(tiny_qwen3_vl_dir):
    from transformers import AutoModelForImageTextToText

    return AutoModelForImageTextToText.from_pretrained(str(tiny_qwen3_vl_dir)).eval()


@pytest.fixture(scope="module")
def video(adapter):
    """3 s at 4 fps → 6 frames at 2 fps → 3 groups, each resized to one size."""
    data = encode_video(source_frames(12, width=80, height=48), fps=4)
    return sample_video(data, VideoLimits(), adapter.video_sampling)


def test_counts_equal_the_video_processors_arithmetic(adapter, video):
    processor = Qwen3VLVideoProcessor()
    count, grid = adapter.video_group_token_count(video.width, video.height)
    patches = processor.get_num_of_video_patches(2, video.height, video.width)
    assert count == patches // processor.merge_size**2
    assert (
        video.num_groups * count
        == processor.get_num_of_video_patches(2 * video.num_groups, video.height, video.width)
        // processor.merge_size**2
    )
    assert grid == (1, video.height // 16, video.width // 16)


def test_patches_equal_the_video_processors_layout(adapter, video):
    runner = adapter.vision_runner()
    prepared = runner.preprocess_video_group(video.group_frames(0))
    frames = torch.from_numpy(video.group_frames(0)).permute(0, 3, 1, 2).float()[None]
    normalised = (frames / 255.0 - 0.5) / 0.5
    expected, t, h, w = Qwen3VLVideoProcessor.patchify(None, normalised, 16, 2, 2)
    assert (t, h, w) == prepared.grid
    torch.testing.assert_close(prepared.pixel_values, expected[0], rtol=0, atol=0)


def test_each_group_alone_equals_its_rows_of_the_whole_video(adapter, hf_model, video):
    runner = adapter.vision_runner()
    groups = [runner.preprocess_video_group(video.group_frames(g)) for g in range(3)]
    ours = runner.encode(groups)
    _, h, w = groups[0].grid
    pixels = torch.cat([g.pixel_values for g in groups])
    with torch.no_grad():
        out = hf_model.model.get_video_features(pixels, torch.tensor([[3, h, w]]))
    main = out.pooler_output[0]
    levels = [level[0] if isinstance(level, tuple) else level for level in out.deepstack_features]
    wide = torch.cat([main, *levels], dim=1)
    torch.testing.assert_close(torch.cat(ours), wide, rtol=1e-5, atol=1e-5)


def _placeholder_prompt(adapter, text_before: str = "watch:") -> list[int]:
    prompt = (
        f"<|im_start|>user\n{text_before}<|vision_start|><|video_pad|><|vision_end|>"
        "what happens?<|im_end|>\n<|im_start|>assistant\n"
    )
    return adapter.encode_prompt(prompt)


def test_expansion_is_the_processors_format(adapter, video):
    ids = _placeholder_prompt(adapter)
    position = ids.index(adapter.video_token_id)
    count, grid = adapter.video_group_token_count(video.width, video.height)
    stamps = [video.sampling.timestamp(g) for g in range(video.num_groups)]
    expanded, spans = adapter.expand_video(ids, position, stamps, grid)
    # Qwen3VLProcessor.replace_video_token's layout, with the timestamps Iris's grid gives.
    layout = "".join(
        f"<{t:.1f} seconds><|vision_start|>" + "<|video_pad|>" * count + "<|vision_end|>"
        for t in stamps
    )
    expected = adapter.encode_prompt(
        f"<|im_start|>user\nwatch:{layout}what happens?<|im_end|>\n<|im_start|>assistant\n"
    )
    assert expanded == expected
    assert [end - start + 1 for start, end in spans] == [count] * video.num_groups
    assert all(expanded[s] == adapter.video_token_id for span in spans for s in span)


def test_positions_equal_hf_get_rope_index_for_video(adapter, hf_model, video):
    ids = _placeholder_prompt(adapter)
    count, grid = adapter.video_group_token_count(video.width, video.height)
    stamps = [video.sampling.timestamp(g) for g in range(video.num_groups)]
    expanded, spans = adapter.expand_video(ids, ids.index(adapter.video_token_id), stamps, grid)
    items = [MultimodalItem(Modality.VIDEO, offsets=[span], grid=grid) for span in spans]
    positions, delta = adapter.mrope_positions(len(expanded), items)
    input_ids = torch.tensor([expanded])
    types = (input_ids == adapter.video_token_id).int() * 2
    expected, expected_delta = hf_model.model.get_rope_index(
        input_ids, types, video_grid_thw=torch.tensor([[video.num_groups, *grid[1:]]])
    )
    np.testing.assert_array_equal(positions, expected[:, 0].numpy())
    assert delta == int(expected_delta)
