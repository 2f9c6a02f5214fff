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
import os
import time
import uuid
from dataclasses import dataclass

from gateway import metrics
from gateway.errors import APIError, bad_request
from gateway.intake.budget import ImageBudget
from gateway.intake.remote import RemoteImageFetcher
from gateway.intake.sources import decode_base64_image
from gateway.intake.video_frames import SEGMENT_PREFIX, SharedFrames, SharedVideo, receive
from gateway.intake.video_frames import remove as remove_frames
from gateway.intake.video_memory import VideoMemory
from gateway.worker_pool import WorkerPool
from iris.multimodal import Modality, MultimodalItem, video_group_identity
from iris.multimodal.video import (
    GROUP_HEADER,
    SampledVideo,
    VideoDecodeError,
    VideoHeader,
    VideoLimits,
    VideoSampling,
    probe_video,
    sample_video,
)

log = logging.getLogger(__name__)


def _decode(
    data: bytes, limits: VideoLimits, sampling: VideoSampling, name: str
) -> SharedVideo | str:
    """In a worker: the sampled video, its frames in shared memory segment `name`
    (video_frames.py), or "setting\0message" for a refusal."""
    remove_frames(name)  # an earlier try of this decode, whose worker died, may have left it
    store = SharedFrames(limits, name)
    try:
        video = sample_video(data, limits, sampling, store)
    except VideoDecodeError as err:
        store.remove()
        return f"{err.setting}\0{err}"
    except BaseException:
        store.remove()
        raise
    return store.hand_over(video)


def _probe(data: bytes, limits: VideoLimits) -> VideoHeader | str:
    """In a worker: the container's header (no frame decoded), or a refusal as `_decode`'s."""
    try:
        return probe_video(data, limits)
    except VideoDecodeError as err:
        return f"{err.setting}\0{err}"


def _ready() -> bool:
    return True


class VideoDecoder:
    """`workers` spawned processes that read video headers and decode videos; `start` /
    `stop` from the lifespan. `memory` bounds the decoded bytes in flight."""

    def __init__(
        self,
        workers: int,
        limits: VideoLimits,
        retry_after_s: int = 1,
        memory: VideoMemory | None = None,
    ) -> None:
        self.workers = max(1, workers)
        self.limits = limits
        self.memory = memory or VideoMemory(1 << 62, 0.0, retry_after_s)
        # A worker that dies is replaced (gateway/worker_pool.py).
        self.pool = WorkerPool("video decoder", self.workers, retry_after_s, _ready)

    def start(self) -> None:
        self.pool.start()

    async def stop(self) -> None:
        await self.pool.stop()

    async def probe(self, data: bytes, param: str) -> VideoHeader:
        """The video's header, read in the pool with no frame decoded; a 400 naming the
        setting for a file that is not a video in an allowed container and codec."""
        return _refused_or(await self.pool.run(_probe, data, self.limits), param)

    async def decode(
        self, data: bytes, sampling: VideoSampling, param: str, limits: VideoLimits | None = None
    ) -> SampledVideo:
        """The sampled video, or a 400 naming the setting that refused it. `limits`: this
        video's (the request's remaining groups, the bytes reserved for it)."""
        metrics.VIDEO_DECODES.inc()
        started = time.monotonic()
        # The gateway names the frames' segment, so that it can remove it whatever became
        # of the worker (killed mid-decode, it could not).
        name = f"{SEGMENT_PREFIX}{os.getpid()}-{uuid.uuid4().hex}"
        try:
            shared = await self.pool.run(
                _decode,
                data,
                limits or self.limits,
                sampling,
                name,
                abandoned=lambda _: remove_frames(name),
            )
        except asyncio.CancelledError:
            raise  # the decode still runs: `abandoned` removes the segment once it is done
        except BaseException:
            remove_frames(name)
            raise
        outcome = receive(_refused_or(shared, param))
        metrics.VIDEO_DECODE_SECONDS.observe(time.monotonic() - started)
        metrics.VIDEO_FRAMES_DECODED.inc(outcome.source_frames)
        metrics.VIDEO_SECONDS.inc(outcome.duration_s)
        return outcome


def _refused_or(outcome, param: str):
    if isinstance(outcome, str):
        setting, message = outcome.split("\0", 1)
        raise refused(f"{param}: {message}", param, setting)
    return outcome


def refused(message: str, param: str, setting: str, code: str = "invalid_video") -> APIError:
    """A 400 for a video, its message naming `setting` (counted by setting)."""
    metrics.VIDEO_REFUSALS.labels(setting).inc()
    return bad_request(f"{message} ({setting})", param, code)


async def video_bytes(
    url: str, fetcher: RemoteImageFetcher, max_bytes: int, param: str, budget: ImageBudget
) -> bytes:
    """The file of one `video_url`: `data:video/<type>;base64,...` or http(s) under the
    images' fetch rules (allow-list, public addresses only, no redirects, a video/* answer)
    and the video's own byte limit, `max_bytes`."""
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
        return await fetcher.fetch(url, param, budget, media="video", max_bytes=max_bytes)
    raise bad_request("video_url must be a data: URL or an http(s) URL", param)


class GroupPayload:
    """Frame group g of a sampled video as the encoder receives it (`pack_group`), packed
    only when asked: `len` costs nothing, `bytes()` copies the group's T frames. The frames
    themselves stay in the video, once (docs/design/multimodal.md, "Video", memory)."""

    def __init__(self, video: SampledVideo, group: int) -> None:
        self.video = video
        self.group = group

    def __len__(self) -> int:
        frames = self.video.sampling.temporal_patch_size
        return GROUP_HEADER.size + frames * self.video.height * self.video.width * 3

    def __bytes__(self) -> bytes:
        return self.video.group_payload(self.group)


class ReleasedGroup:
    """A frame group whose frames were released once its request's choices were accepted:
    its size stays known; its bytes, needed only by a retry that must encode it again (the
    cache lost it), are a 503."""

    def __init__(self, size: int) -> None:
        self.size = size

    def __len__(self) -> int:
        return self.size

    def __bytes__(self) -> bytes:
        raise APIError(
            503,
            "a video's frames were released once the request was accepted, and a retry "
            "needs them again; send the request again",
            code="overloaded",
            retry_after=1,
        )


@dataclass
class VideoGroups:
    """One video's items (one per frame group, in time order), their payloads for the
    encoder (`GroupPayload`s) and their timestamps in seconds."""

    items: list[MultimodalItem]
    payloads: list[GroupPayload]
    timestamps: list[float]


def describe_video(
    video: SampledVideo, *, adapter, fingerprint: bytes, salt: bytes | None
) -> VideoGroups:
    """Each frame group as an item: the adapter's token count and grid for the group's size,
    identity from its frames, hashed where they lie (offsets are set once the prompt is
    expanded): no copy of the video or of a group is made."""
    token_count, grid = adapter.video_group_token_count(video.width, video.height)
    items, payloads = [], []
    for group in range(video.num_groups):
        payload = GroupPayload(video, group)
        item = MultimodalItem(Modality.VIDEO, token_count=int(token_count), grid=tuple(grid))
        item.set_identity(video_group_identity(video.group_parts(group), fingerprint, salt))
        items.append(item)
        payloads.append(payload)
    timestamps = [video.sampling.timestamp(group) for group in range(video.num_groups)]
    return VideoGroups(items, payloads, timestamps)


def check_group_count(groups: int, limit: int, param: str) -> None:
    """400 when a request's videos hold more frame groups than `video_max_groups`."""
    if groups > limit:
        raise refused(
            f"request has {groups} video frame groups, over the limit of {limit}",
            param,
            "video_max_groups",
        )
