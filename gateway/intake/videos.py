"""`video_url` parts → frame-group items (docs/design/multimodal.md).

A video is decoded, sampled and resized in a pool of worker processes (spawned, as the body
parser's are: FFmpeg and the resize hold the GIL or a core for the whole file, so neither
the loop nor a thread of it may run them). The gateway keeps only the sampled frames: each
frame group becomes one item whose identity is the BLAKE3 of its frames (with the
fingerprint and the request's salt), so a group any pod or the cache already holds is never
encoded again, whichever clip or request it came from.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass

from gateway import metrics
from gateway.errors import APIError, bad_request
from gateway.intake.budget import ImageBudget
from gateway.intake.remote import RemoteImageFetcher
from gateway.intake.sources import decode_base64_image
from gateway.worker_pool import WorkerPool
from iris.multimodal import Modality, MultimodalItem, video_group_identity
from iris.multimodal.video import (
    SampledVideo,
    VideoDecodeError,
    VideoLimits,
    VideoSampling,
    sample_video,
)

log = logging.getLogger(__name__)


def _decode(data: bytes, limits: VideoLimits, sampling: VideoSampling) -> SampledVideo | str:
    """In a worker: the sampled video, or "setting\\0message" for a refusal."""
    try:
        return sample_video(data, limits, sampling)
    except VideoDecodeError as err:
        return f"{err.setting}\0{err}"


def _ready() -> bool:
    return True


class VideoDecoder:
    """`workers` spawned processes that decode videos; `start` / `stop` from the lifespan."""

    def __init__(self, workers: int, limits: VideoLimits, retry_after_s: int = 1) -> None:
        self.workers = max(1, workers)
        self.limits = limits
        # A worker that dies is replaced (gateway/worker_pool.py).
        self.pool = WorkerPool("video decoder", self.workers, retry_after_s, _ready)

    def start(self) -> None:
        self.pool.start()

    async def stop(self) -> None:
        await self.pool.stop()

    async def decode(self, data: bytes, sampling: VideoSampling, param: str) -> SampledVideo:
        """The sampled video, or a 400 naming the setting that refused it."""
        started = time.monotonic()
        outcome = await self.pool.run(_decode, data, self.limits, sampling)
        metrics.VIDEO_DECODE_SECONDS.observe(time.monotonic() - started)
        if isinstance(outcome, str):
            setting, message = outcome.split("\0", 1)
            raise bad_request(f"{param}: {message} ({setting})", param, "invalid_video")
        metrics.VIDEO_SECONDS.inc(outcome.duration_s)
        return outcome


async def video_bytes(
    url: str, fetcher: RemoteImageFetcher, max_bytes: int, param: str, budget: ImageBudget
) -> bytes:
    """The file of one `video_url`: `data:video/<type>;base64,...` or http(s) under the
    images' fetch rules (allow-list, public addresses only, no redirects, a video/* answer)."""
    if url.startswith("data:"):
        comma = url.find(",", 0, 256)  # the header is short; the payload is never copied
        header = url[:comma] if comma >= 0 else ""
        if comma < 0 or not header.endswith(";base64"):
            raise bad_request("video data URL must be data:<mime>;base64,<data>", param)
        mime = header[5:-7]
        if mime and not mime.startswith("video/"):
            raise bad_request(f"video data URL has media type {mime!r}, not video/*", param)
        try:
            # On a worker thread, in windows, as inline images are (docs/design/door.md).
            data = await asyncio.to_thread(decode_base64_image, url, max_bytes, param, comma + 1)
        except APIError as err:  # the image helper's words: say video, name the setting
            raise bad_request(
                f"{param}: {err.message.replace('image', 'video')} (video_max_bytes)",
                param,
                "invalid_video",
            ) from None
        budget.charge_bytes(len(data), param)
        return data
    if url.startswith(("http://", "https://")):
        return await fetcher.fetch(url, param, budget, media="video")
    raise bad_request("video_url must be a data: URL or an http(s) URL", param)


@dataclass
class VideoGroups:
    """One video's items (one per frame group, in time order), their payloads for the
    encoder (`iris.multimodal.video.pack_group`) and their timestamps in seconds."""

    items: list[MultimodalItem]
    payloads: list[bytes]
    timestamps: list[float]


def describe_video(
    video: SampledVideo, *, adapter, fingerprint: bytes, salt: bytes | None
) -> VideoGroups:
    """Each frame group as an item: the adapter's token count and grid for the group's size,
    identity from its frames (offsets are set once the prompt is expanded)."""
    token_count, grid = adapter.video_group_token_count(video.width, video.height)
    items, payloads = [], []
    for group in range(video.num_groups):
        payload = video.group_payload(group)
        item = MultimodalItem(Modality.VIDEO, token_count=int(token_count), grid=tuple(grid))
        item.set_identity(video_group_identity(payload, fingerprint, salt))
        items.append(item)
        payloads.append(payload)
    timestamps = [video.sampling.timestamp(group) for group in range(video.num_groups)]
    return VideoGroups(items, payloads, timestamps)


def check_group_count(groups: int, limit: int, param: str) -> None:
    """400 when a request's videos hold more frame groups than `video_max_groups`."""
    if groups > limit:
        raise bad_request(
            f"request has {groups} video frame groups, over the limit of {limit} "
            "(video_max_groups)",
            param,
            "invalid_video",
        )
