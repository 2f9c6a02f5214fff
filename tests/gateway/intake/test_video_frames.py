"""A sampled video's frames cross from a decode worker to the gateway in shared memory
(gateway/intake/video_frames.py): the gateway sees the frames the plain decode keeps, each
distinct frame once, and the segment's name is gone once they are received."""

from __future__ import annotations

import dataclasses
import os

import numpy as np
import pytest

from gateway.intake.video_frames import SharedFrames, SharedVideo, receive
from iris.multimodal.video import VideoDecodeError, VideoLimits, VideoSampling, sample_video
from tests.fixtures.videos import encode_video, source_frames

SAMPLING = VideoSampling(min_pixels=16 * 32 * 32, max_pixels=64 * 32 * 32)


def test_frames_received_from_shared_memory_are_the_decoded_ones():
    data = encode_video(source_frames(12, 96, 64), fps=4)
    plain = sample_video(data, VideoLimits(), SAMPLING)
    store = SharedFrames(VideoLimits())
    shared = store.hand_over(sample_video(data, VideoLimits(), SAMPLING, store))
    assert isinstance(shared, SharedVideo)
    video = receive(shared)
    assert not os.path.exists(f"/dev/shm/{shared.name}")
    assert video.slots == plain.slots
    assert len(video.distinct) == len(plain.distinct) == 6
    for got, expected in zip(video.distinct, plain.distinct, strict=True):
        assert np.array_equal(got, expected)
    assert video.group_payload(2) == plain.group_payload(2)


def test_a_slow_clip_keeps_each_decoded_frame_once():
    """1 fps under a 2 fps grid: every frame fills two slots, kept once."""
    data = encode_video(source_frames(4, 96, 64), fps=1)
    video = sample_video(data, VideoLimits(), SAMPLING)
    assert len(video.slots) == 8 and len(video.distinct) == 4
    assert video.slots == [0, 0, 1, 1, 2, 2, 3, 3]
    assert video.decoded_bytes == 4 * video.distinct[0].nbytes


def test_a_refused_decode_leaves_no_segment():
    data = encode_video(source_frames(12, 96, 64), fps=4)
    limits = dataclasses.replace(VideoLimits(), max_frames=3)
    store = SharedFrames(limits)
    with pytest.raises(VideoDecodeError):
        sample_video(data, limits, SAMPLING, store)
    name = store.segment.name
    store.remove()
    assert store.segment is None and not os.path.exists(f"/dev/shm/{name}")


def test_a_group_hashed_where_its_frames_lie_has_its_packed_identity():
    from iris.multimodal import video_group_identity

    video = sample_video(encode_video(source_frames(4, 96, 64), fps=1), VideoLimits(), SAMPLING)
    fingerprint, salt = bytes(range(32)), bytes(32 * [7])
    for group in range(video.num_groups):
        packed = video_group_identity(video.group_payload(group), fingerprint, salt)
        assert video_group_identity(video.group_parts(group), fingerprint, salt) == packed
