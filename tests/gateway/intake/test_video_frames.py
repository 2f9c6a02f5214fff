"""A sampled video's frames cross from a decode worker to the gateway in shared memory
(gateway/intake/video_frames.py): the gateway sees the frames the plain decode keeps, each
distinct frame once, and the segment's name is gone once they are received."""

from __future__ import annotations

import dataclasses
import os
import uuid

import numpy as np
import pytest

from gateway.errors import APIError
from gateway.intake.video_frames import SEGMENT_PREFIX, SharedFrames, SharedVideo, receive
from gateway.intake.videos import VideoDecoder, _decode
from iris.multimodal.video import VideoLimits, VideoSampling, sample_video
from tests.fixtures.videos import encode_video, source_frames

SHM = "/dev/shm"
SAMPLING = VideoSampling(min_pixels=16 * 32 * 32, max_pixels=64 * 32 * 32)


def test_frames_received_from_shared_memory_are_the_decoded_ones():
    data = encode_video(source_frames(12, 96, 64), fps=4)
    plain = sample_video(data, VideoLimits(), SAMPLING)
    store = SharedFrames(VideoLimits(), f"{SEGMENT_PREFIX}test-{uuid.uuid4().hex}")
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
    """The decode path a worker runs: refused past its first frames, its segment goes."""
    data = encode_video(source_frames(12, 96, 64), fps=4)
    limits = dataclasses.replace(VideoLimits(), max_frames=3)
    name = f"{SEGMENT_PREFIX}test-{uuid.uuid4().hex}"
    outcome = _decode(data, limits, SAMPLING, name)
    assert outcome.startswith("video_max_frames\0"), outcome
    assert not os.path.exists(f"{SHM}/{name}")


_SEEN: set[str] | None = None  # in the worker: /dev/shm as the decode began


def _segment_made() -> bool:
    """In the worker: whether a segment appeared in /dev/shm since the first call."""
    global _SEEN
    now = set(os.listdir(SHM))
    if _SEEN is None:
        _SEEN = now
    return bool(now - _SEEN)


@dataclasses.dataclass(frozen=True)
class DyingSampling(VideoSampling):
    """Kills the worker that decodes with it once the decode's segment exists (its frames
    are being kept): a worker killed mid-decode, whenever it is scheduled."""

    def __getattribute__(self, name: str):
        if name == "fps" and _segment_made():
            os._exit(1)
        return super().__getattribute__(name)


async def test_a_worker_killed_mid_decode_leaves_no_segment():
    """The gateway names the segment, so it removes it when the worker dies (a 503)."""
    data = encode_video(source_frames(12, 96, 64), fps=4)
    sampling = DyingSampling(min_pixels=SAMPLING.min_pixels, max_pixels=SAMPLING.max_pixels)
    decoder = VideoDecoder(1, VideoLimits())
    decoder.start()
    # This process's segments only: other test workers may make and remove their own meanwhile.
    mine = f"{SEGMENT_PREFIX}{os.getpid()}-"
    before = {name for name in os.listdir(SHM) if name.startswith(mine)}
    try:
        with pytest.raises(APIError) as lost:
            await decoder.decode(data, sampling, "messages[0].content[0]")
        assert lost.value.status == 503
    finally:
        await decoder.stop()
    assert {name for name in os.listdir(SHM) if name.startswith(mine)} - before == set()


def test_a_group_hashed_where_its_frames_lie_has_its_packed_identity():
    from iris.multimodal import video_group_identity

    video = sample_video(encode_video(source_frames(4, 96, 64), fps=1), VideoLimits(), SAMPLING)
    fingerprint, salt = bytes(range(32)), bytes(32 * [7])
    for group in range(video.num_groups):
        packed = video_group_identity(video.group_payload(group), fingerprint, salt)
        assert video_group_identity(video.group_parts(group), fingerprint, salt) == packed
