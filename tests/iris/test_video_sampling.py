"""Iris's video sampling rule and its bounds (iris/multimodal/video.py), on real files
written with PyAV; the size rule and timestamps against transformers' own arithmetic."""

from __future__ import annotations

import dataclasses
import struct

import numpy as np
import pytest
from PIL import Image
from transformers.models.qwen3_vl.processing_qwen3_vl import Qwen3VLProcessor
from transformers.models.qwen3_vl.video_processing_qwen3_vl import smart_resize

from iris.multimodal.video import (
    VideoDecodeError,
    VideoLimits,
    VideoSampling,
    pack_group,
    sample_video,
    unpack_group,
)
from tests.fixtures.videos import encode_video, source_frames

SAMPLING = VideoSampling()
LIMITS = VideoLimits()


def _resized(frame: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    return np.asarray(Image.fromarray(frame).resize(size, Image.Resampling.BICUBIC))


def _decoded(data: bytes) -> list[np.ndarray]:
    """Every frame of `data` as PyAV decodes it (the codec's YUV round trip included)."""
    import io

    import av

    with av.open(io.BytesIO(data)) as container:
        return [frame.to_ndarray(format="rgb24") for frame in container.decode(video=0)]


def test_frames_on_the_absolute_grid_nearest_decoded_frame():
    """Source at 4 fps, sampled at 2: frames 0, 2, 4, ...; source at 3 fps: the nearest
    decoded frame to k/2 s (ties to the earlier)."""
    data = encode_video(source_frames(12), fps=4)
    src = _decoded(data)
    video = sample_video(data, LIMITS, SAMPLING)
    size = (video.width, video.height)
    assert video.frames.shape[0] == 6
    for k in range(6):
        assert np.array_equal(video.frames[k], _resized(src[2 * k], size))
    data = encode_video(source_frames(12), fps=3)
    src = _decoded(data)
    video = sample_video(data, LIMITS, SAMPLING)
    # grid 0, .5, 1, 1.5, 2, 2.5, 3, 3.5 s against frames at k/3 s (last frame 11/3 s)
    expected = [0, 1, 3, 4, 6, 7, 9, 10]
    assert video.frames.shape[0] == len(expected)
    for k, index in enumerate(expected):
        assert np.array_equal(video.frames[k], _resized(src[index], size))


def test_short_last_group_repeats_its_last_frame():
    video = sample_video(encode_video(source_frames(6), fps=4), LIMITS, SAMPLING)
    assert video.frames.shape[0] == 4  # 3 grid frames (0, .5, 1 s) + 1 repeat
    assert np.array_equal(video.frames[3], video.frames[2])


@pytest.mark.parametrize("size", [(96, 64), (640, 360), (30, 1000), (1920, 1080)])
def test_one_size_per_frame_is_the_processors_smart_resize_for_two_frames(size):
    width, height = size
    factor = SAMPLING.patch_size * SAMPLING.merge_size
    h, w = smart_resize(
        2, height, width, 2, factor, SAMPLING.min_pixels, SAMPLING.max_pixels
    )  # fmt: skip
    assert SAMPLING.resized(width, height) == (w, h)


def test_size_does_not_depend_on_clip_length():
    src = source_frames(24)
    short = sample_video(encode_video(src[:4]), LIMITS, SAMPLING)
    long = sample_video(encode_video(src), LIMITS, SAMPLING)
    assert (short.width, short.height) == (long.width, long.height)


def test_timestamps_equal_the_processors_for_the_grid_indices():
    fps = SAMPLING.fps
    indices = list(range(12))  # grid frame k sits at k / fps
    expected = Qwen3VLProcessor._calculate_timestamps(None, indices, fps, 2)
    assert [SAMPLING.timestamp(g) for g in range(6)] == expected
    assert [f"<{SAMPLING.timestamp(g):.1f} seconds>" for g in range(3)] == [
        "<0.2 seconds>",
        "<1.2 seconds>",
        "<2.2 seconds>",
    ]


@pytest.mark.parametrize(("codec", "container"), [("ffv1", "matroska"), ("mjpeg", "avi")])
def test_aligned_overlapping_clips_share_their_groups(codec, container):
    """Groups are 1 s at 2 fps; a clip cut 2 s later shares groups 2.. bit for bit."""
    src = source_frames(32)
    first = sample_video(encode_video(src[:24], 4, codec, container), LIMITS, SAMPLING)
    second = sample_video(encode_video(src[8:32], 4, codec, container), LIMITS, SAMPLING)
    assert first.num_groups == second.num_groups == 6
    for g in range(4):
        assert first.group_payload(g + 2) == second.group_payload(g)
    assert first.group_payload(0) != second.group_payload(0)


def test_group_payload_round_trips():
    video = sample_video(encode_video(source_frames(4)), LIMITS, SAMPLING)
    frames = unpack_group(video.group_payload(0))
    assert np.array_equal(frames, video.group_frames(0))
    with pytest.raises(ValueError, match="must be"):
        unpack_group(pack_group(frames)[:-1])


# One test per bound: each refusal names its setting.
BOUNDS = [
    ("video_max_bytes", {"max_bytes": 1000}),
    ("video_max_duration_s", {"max_duration_s": 2.0}),
    ("video_max_frames", {"max_frames": 5}),
    ("video_max_frame_pixels", {"max_frame_pixels": 96 * 64 - 1}),
    ("video_max_total_pixels", {"max_total_pixels": 4 * 96 * 64}),
    ("video_max_groups", {"max_groups": 3}),
    ("video_max_decode_s", {"max_decode_s": 1e-9}),
]


@pytest.mark.parametrize(("setting", "change"), BOUNDS, ids=[b[0] for b in BOUNDS])
def test_each_bound_refuses_naming_its_setting(setting, change):
    data = encode_video(source_frames(16), fps=4)  # 4 s, 8 sampled frames, 4 groups
    sample_video(data, LIMITS, SAMPLING)  # within the defaults
    with pytest.raises(VideoDecodeError) as refused:
        sample_video(data, dataclasses.replace(LIMITS, **change), SAMPLING)
    assert refused.value.setting == setting


def _png() -> bytes:
    import io

    out = io.BytesIO()
    Image.new("RGB", (8, 8)).save(out, format="PNG")
    return out.getvalue()


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"hello, not a video at all",
        _png(),
        b"\x1a\x45\xdf\xa3" + bytes(range(256)) * 8,  # Matroska magic, then garbage
        b"\x00\x00\x00\x18ftypisom" + b"\x00" * 500,  # an MP4 header and nothing else
        encode_video(source_frames(8))[:400],  # cut short
    ],
    ids=["empty", "text", "png", "garbage-mkv", "empty-mp4", "truncated"],
)
def test_corrupt_or_non_video_files_are_refused(data):
    with pytest.raises(VideoDecodeError):
        sample_video(data, LIMITS, SAMPLING)


def test_a_stream_that_lies_about_its_length_is_refused():
    """An AVI whose headers declare 4 frames (1 s) but that holds 40."""
    data = bytearray(encode_video(source_frames(40), 4, "mjpeg", "avi"))
    stream_header = data.find(b"strh")
    struct.pack_into("<I", data, stream_header + 8 + 32, 4)  # strh dwLength
    main_header = data.find(b"avih")
    struct.pack_into("<I", data, main_header + 8 + 16, 4)  # avih dwTotalFrames
    with pytest.raises(VideoDecodeError, match="declares 1.0 s but holds a frame"):
        sample_video(bytes(data), LIMITS, SAMPLING)
