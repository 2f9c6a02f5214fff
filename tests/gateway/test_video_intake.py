"""The gateway's video intake (gateway/intake/videos.py): decoding runs in a spawned worker
process; a refusal is a 400 naming its setting; each frame group is an item whose identity
is shared by an aligned overlapping clip and differs under another salt."""

from __future__ import annotations

import asyncio
import base64
import dataclasses

import pytest

from gateway.errors import APIError
from gateway.intake.budget import ImageBudget
from gateway.intake.remote import RemoteImageFetcher
from gateway.intake.videos import VideoDecoder, check_group_count, describe_video, video_bytes
from iris.models import load_adapter
from iris.multimodal import Modality
from iris.multimodal.video import VideoLimits
from tests.fixtures.videos import encode_video, source_frames

FETCHER = RemoteImageFetcher(enabled=False, allow_list=[], max_bytes=1, timeout_s=1)


@pytest.fixture(scope="module")
def adapter(tiny_qwen3_vl_dir):
    return load_adapter(tiny_qwen3_vl_dir)


def _decode(decoder: VideoDecoder, data: bytes, adapter):
    async def run():
        try:
            return await decoder.decode(data, adapter.video_sampling, "messages[0].content[0]")
        finally:
            await decoder.stop()

    return asyncio.run(run())


def test_overlapping_clips_share_group_identities_and_salts_separate_them(adapter):
    src = source_frames(32)
    decoder = VideoDecoder(1, VideoLimits())
    first = _decode(decoder, encode_video(src[:24]), adapter)
    second = _decode(decoder, encode_video(src[8:32]), adapter)
    fingerprint = adapter.fingerprint
    a = describe_video(first, adapter=adapter, fingerprint=fingerprint, salt=None)
    b = describe_video(second, adapter=adapter, fingerprint=fingerprint, salt=None)
    assert all(item.modality == Modality.VIDEO for item in a.items)
    ids_a = [item.identity for item in a.items]
    ids_b = [item.identity for item in b.items]
    assert ids_a[2:] == ids_b[:4]  # 4 of 6 aligned groups shared
    assert not set(ids_b[4:]) & set(ids_a)
    salted = describe_video(first, adapter=adapter, fingerprint=fingerprint, salt=b"s" * 32)
    assert not {item.identity for item in salted.items} & set(ids_a)
    assert [f"{t:.1f}" for t in a.timestamps[:2]] == ["0.2", "1.2"]


def test_a_refusal_from_the_worker_is_a_400_naming_the_setting(adapter):
    decoder = VideoDecoder(1, dataclasses.replace(VideoLimits(), max_duration_s=1.0))
    with pytest.raises(APIError) as refused:
        _decode(decoder, encode_video(source_frames(16)), adapter)
    assert refused.value.status == 400
    assert "video_max_duration_s" in refused.value.message
    decoder = VideoDecoder(1, VideoLimits())
    with pytest.raises(APIError) as refused:
        _decode(decoder, b"not a video", adapter)
    assert refused.value.status == 400


def test_group_count_and_data_url_bounds():
    with pytest.raises(APIError, match="video_max_groups"):
        check_group_count(5, 4, "messages")
    check_group_count(4, 4, "messages")
    data = encode_video(source_frames(4))
    url = "data:video/x-matroska;base64," + base64.b64encode(data).decode()
    budget = ImageBudget(1 << 30, 1 << 40)
    assert asyncio.run(video_bytes(url, FETCHER, len(data), "p", budget)) == data
    with pytest.raises(APIError, match="video_max_bytes"):
        asyncio.run(video_bytes(url, FETCHER, len(data) - 100, "p", budget))
    with pytest.raises(APIError, match="not video"):
        asyncio.run(video_bytes("data:image/png;base64,AAAA", FETCHER, 100, "p", budget))
