"""Video decode and Iris's sampling rule (docs/design/multimodal.md, "Video"): one set of rules for
the gateway (count, hash) and the encoder (the frames it is sent are the ones hashed).

The rule is chosen so that frame groups can be shared between clips:
- frame k is the decoded frame nearest to t = k / fps (an absolute time grid from the
  clip's first frame), not HF's `linspace` over the whole clip;
- every frame gets one size, `smart_resize(num_frames=temporal_patch_size, h, w)` within
  the processor's `size` bounds, so a frame's size does not depend on the clip's length;
- group g holds frames g*T .. g*T+T-1 (T = temporal_patch_size), so group boundaries fall
  at multiples of T / fps seconds; a short last group repeats its last frame, as HF's
  patchify pads.

Every bound is checked while decoding (the container's own claims are not trusted) and a
refusal is a `VideoDecodeError` naming the setting that refused it.
"""

from __future__ import annotations

import io
import math
import struct
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
from PIL import Image

# Container formats, recognised from their first bytes and then opened with that demuxer
# only: FFmpeg's probing would also accept playlists (HLS, concat) that open other URLs.
_CONTAINERS = (
    (4, b"ftyp", "mov"),  # MP4 / MOV / 3GP (ISO base media)
    (0, b"\x1a\x45\xdf\xa3", "matroska"),  # Matroska / WebM
    (0, b"RIFF", "avi"),
)
ALLOWED_CODECS = frozenset(
    {"h264", "hevc", "vp8", "vp9", "av1", "mpeg4", "mjpeg", "ffv1", "mpeg2video", "png"}
)
# A stream's frames may run past its declared duration by this much before it is refused as
# lying about its length (container rounding, a last frame's own duration).
_DURATION_SLACK_S = 1.0
GROUP_HEADER = struct.Struct(">4sHII")  # magic, frames, height, width
GROUP_MAGIC = b"IRVG"


class VideoDecodeError(ValueError):
    """A video the policy refuses; `setting` names the gateway setting that refused it (or
    "video" for a file that is not a readable video)."""

    def __init__(self, message: str, setting: str = "video") -> None:
        super().__init__(message)
        self.setting = setting


@dataclass(frozen=True)
class VideoLimits:
    """The work one video may cost (gateway settings `video_max_*`)."""

    max_bytes: int = 16 * 1024 * 1024
    max_duration_s: float = 300.0
    max_frames: int = 600  # sampled
    max_frame_pixels: int = 3840 * 2160  # a decoded frame, before resizing
    max_total_pixels: int = 600 * 1920 * 1080  # sampled frames, before resizing
    max_groups: int = 300  # frame groups per request, over all its videos
    max_decode_s: float = 30.0
    # Set per video by the gateway: what is left of the request's groups (or of its context,
    # then `groups_setting` names that) and of the gateway's decoded bytes in flight.
    groups_setting: str = "video_max_groups"
    max_decoded_bytes: int = 1 << 62


@dataclass(frozen=True)
class VideoSampling:
    """The processor's settings that decide which frames are taken and their size."""

    fps: float = 2.0
    temporal_patch_size: int = 2
    patch_size: int = 16
    merge_size: int = 2
    min_pixels: int = 128 * 32 * 32  # the video processor's size: over T frames
    max_pixels: int = 768 * 32 * 32
    # Qwen2-VL / Qwen2.5-VL's video processor bounds one frame (its smart_resize has no
    # frame count); Qwen3-VL's bounds the T frames of a group together.
    per_frame_bounds: bool = False
    # A family's own frame size rule in place of smart_resize: an object whose
    # `target_size(width, height)` gives (width, height) (Gemma 4's SoftTokenRule).
    size_rule: Any = None

    def resized(self, width: int, height: int) -> tuple[int, int]:
        """(width, height) of every frame: the processor's smart_resize for T frames, or
        the family's `size_rule`."""
        if self.size_rule is not None:
            return self.size_rule.target_size(width, height)
        factor = self.patch_size * self.merge_size
        frames = 1 if self.per_frame_bounds else self.temporal_patch_size
        if height < factor or width < factor:
            scale = max(factor / height, factor / width)
            height, width = int(height * scale), int(width * scale)
        ratio = max(height, width) / min(height, width)
        if ratio > 200:
            raise VideoDecodeError(
                f"video aspect ratio {ratio:.1f} ({width}x{height}) is over the limit of 200"
            )
        h_bar = round(height / factor) * factor
        w_bar = round(width / factor) * factor
        if frames * h_bar * w_bar > self.max_pixels:
            beta = math.sqrt((frames * height * width) / self.max_pixels)
            h_bar = max(factor, math.floor(height / beta / factor) * factor)
            w_bar = max(factor, math.floor(width / beta / factor) * factor)
        elif frames * h_bar * w_bar < self.min_pixels:
            beta = math.sqrt(self.min_pixels / (frames * height * width))
            h_bar = math.ceil(height * beta / factor) * factor
            w_bar = math.ceil(width * beta / factor) * factor
        return w_bar, h_bar

    def timestamp(self, group: int) -> float:
        """Group g's time: the mean of its frames' grid times, from the clip's first frame."""
        frames = self.temporal_patch_size
        return (group * frames + (frames - 1) / 2) / self.fps


@dataclass
class SampledVideo:
    """A video after sampling and resizing. `distinct` holds each decoded frame the grid took,
    resized once, uint8 [H, W, 3]; `slots` names, for each grid slot in time order, the
    distinct frame it shows (a frame taken by several grid times, or the repeats padding a
    short last group, is one array referred to again). len(slots) is a multiple of the
    temporal patch size."""

    distinct: list[np.ndarray]
    slots: list[int]
    sampling: VideoSampling
    source_frames: int  # decoded
    duration_s: float  # of the last decoded frame, from the first

    @property
    def num_groups(self) -> int:
        return len(self.slots) // self.sampling.temporal_patch_size

    @property
    def height(self) -> int:
        return int(self.distinct[0].shape[0])

    @property
    def width(self) -> int:
        return int(self.distinct[0].shape[1])

    @property
    def decoded_bytes(self) -> int:
        """What the kept frames take: distinct frames x H x W x 3."""
        return sum(frame.nbytes for frame in self.distinct)

    @property
    def frames(self) -> np.ndarray:
        """Every slot's frame as one array [N, H, W, 3]: a copy, for tests and tools."""
        return np.stack([self.distinct[k] for k in self.slots])

    def group_frames(self, group: int) -> np.ndarray:
        """Group g's T frames [T, H, W, 3] (a copy of T frames)."""
        frames = self.sampling.temporal_patch_size
        slots = self.slots[group * frames : (group + 1) * frames]
        return np.stack([self.distinct[k] for k in slots])

    def group_payload(self, group: int) -> bytes:
        """Group g as the encoder receives it and identity hashes it (`pack_group`)."""
        return pack_group(self.group_frames(group))

    def group_parts(self, group: int) -> list:
        """`group_payload(group)` as buffers in order, the header then each frame where it
        lies (no copy): what identity hashing reads."""
        frames = self.sampling.temporal_patch_size
        slots = self.slots[group * frames : (group + 1) * frames]
        header = GROUP_HEADER.pack(GROUP_MAGIC, len(slots), self.height, self.width)
        return [header, *(np.ascontiguousarray(self.distinct[k]) for k in slots)]


@dataclass(frozen=True)
class VideoHeader:
    """What a container says of its first video stream before any frame is decoded."""

    width: int
    height: int
    duration_s: float | None  # declared; None when the container gives none

    def grid_frames(self, sampling: VideoSampling) -> int | None:
        """Frames the time grid would take over the declared duration (t = k/fps < duration,
        padded to whole groups), or None without a duration."""
        if self.duration_s is None:
            return None
        frames = max(1, math.ceil(self.duration_s * sampling.fps - 1e-9))
        patch = sampling.temporal_patch_size
        return -(-frames // patch) * patch


def pack_group(frames: np.ndarray) -> bytes:
    """A frame group's bytes: header (magic, frames, height, width) + its RGB pixels."""
    count, height, width, channels = frames.shape
    if channels != 3 or frames.dtype != np.uint8:
        raise ValueError(f"a frame group is uint8 [T, H, W, 3], got {frames.dtype} {frames.shape}")
    header = GROUP_HEADER.pack(GROUP_MAGIC, count, height, width)
    return header + np.ascontiguousarray(frames).tobytes()


def unpack_group(payload: bytes | memoryview) -> np.ndarray:
    """`pack_group`'s inverse; ValueError naming what does not fit."""
    if len(payload) < GROUP_HEADER.size:
        raise ValueError(f"frame group is {len(payload)} bytes, shorter than its header")
    magic, count, height, width = GROUP_HEADER.unpack_from(payload)
    if magic != GROUP_MAGIC:
        raise ValueError("frame group does not start with the IRVG header")
    expected = GROUP_HEADER.size + count * height * width * 3
    if len(payload) != expected:
        raise ValueError(
            f"frame group {count}x{height}x{width} must be {expected} bytes, got {len(payload)}"
        )
    pixels = np.frombuffer(payload, dtype=np.uint8, offset=GROUP_HEADER.size)
    return pixels.reshape(count, height, width, 3)


def container_format(data: bytes | memoryview) -> str:
    """The demuxer for `data`, from its first bytes; VideoDecodeError if none is allowed."""
    head = bytes(data[:16])
    for offset, magic, name in _CONTAINERS:
        if head[offset : offset + len(magic)] == magic:
            if name == "avi" and head[8:12] != b"AVI ":
                continue
            return name
    raise VideoDecodeError("not a supported video container (MP4/MOV, Matroska/WebM, AVI)")


def _open(data: bytes | memoryview, limits: VideoLimits):
    """The container, opened with the demuxer its first bytes name, after the byte bound."""
    if len(data) > limits.max_bytes:
        raise VideoDecodeError(
            f"video is {len(data)} bytes, over the limit of {limits.max_bytes}",
            "video_max_bytes",
        )
    if len(data) == 0:
        raise VideoDecodeError("video is empty (0 bytes)")
    import av  # PyAV: imported where decoding runs (worker processes, the encoder)

    demuxer = container_format(data)
    try:
        return av.open(io.BytesIO(data), format=demuxer, mode="r")
    except (av.FFmpegError, ValueError, OSError):
        raise VideoDecodeError("cannot read the video: not a valid video file") from None


def _video_stream(container):
    if not container.streams.video:
        raise VideoDecodeError("the file holds no video stream")
    stream = container.streams.video[0]
    codec = stream.codec_context.name
    if codec not in ALLOWED_CODECS:
        allowed = ", ".join(sorted(ALLOWED_CODECS))
        raise VideoDecodeError(f"video codec {codec} not allowed (allowed: {allowed})")
    return stream


def probe_video(data: bytes | memoryview, limits: VideoLimits) -> VideoHeader:
    """The container's header: its first video stream's size and declared duration, with
    no frame decoded. Refusals as `sample_video`'s for the bytes, container and codec."""
    container = _open(data, limits)
    try:
        stream = _video_stream(container)
        width, height = stream.codec_context.width, stream.codec_context.height
        if width <= 0 or height <= 0:
            raise VideoDecodeError(f"video stream declares a frame of {width}x{height}")
        return VideoHeader(width, height, _declared_duration(container, stream))
    finally:
        container.close()


class FrameStore:
    """Where the kept frames live: `keep` appends a frame to `frames`, the list the sampled
    video refers to (here the frame itself; the gateway's decode workers put frames in
    shared memory instead, and may move them back)."""

    def __init__(self) -> None:
        self.frames: list[np.ndarray] = []

    def keep(self, frame: np.ndarray) -> None:
        self.frames.append(frame)


def sample_video(
    data: bytes | memoryview,
    limits: VideoLimits,
    sampling: VideoSampling,
    store: FrameStore | None = None,
) -> SampledVideo:
    """Decode `data` and take Iris's grid of frames (module docstring), under `limits`.

    Refusals (VideoDecodeError, naming the setting): too many bytes, a file that is not a
    video in an allowed container and codec, a decoded frame over `max_frame_pixels`, a
    frame past `max_duration_s` or past the stream's own declared length, more sampled
    frames, groups, pixels or kept bytes than allowed, and decoding past `max_decode_s`;
    each at the first frame that crosses it.
    """
    started = time.monotonic()
    import av

    container = _open(data, limits)
    try:
        return _sample(container, limits, sampling, started, store or FrameStore())
    except av.FFmpegError:
        raise VideoDecodeError("video data is corrupt: decoding failed") from None
    finally:
        container.close()


class _Grid:
    """The grid's slots as they are taken: each decoded frame is resized once, when the grid
    first takes it, and every later slot that shows it refers to the same array."""

    def __init__(self, limits: VideoLimits, sampling: VideoSampling, store: FrameStore) -> None:
        self.store = store
        self.limits = limits
        self.sampling = sampling
        self.distinct: list[np.ndarray] = store.frames
        self.slots: list[int] = []
        self.size: tuple[int, int] | None = None  # (width, height) every frame is resized to
        self.pixels = 0
        self._last = None  # the decoded frame behind distinct[-1]

    def take(self, frame) -> None:
        limits, sampling = self.limits, self.sampling
        if len(self.slots) >= limits.max_frames:
            raise VideoDecodeError(
                f"video samples more than {limits.max_frames} frames at {sampling.fps} fps",
                "video_max_frames",
            )
        if len(self.slots) >= limits.max_groups * sampling.temporal_patch_size:
            raise VideoDecodeError(
                f"video's frames make more than {limits.max_groups} frame groups",
                limits.groups_setting,
            )
        self.pixels += frame.width * frame.height
        if self.pixels > limits.max_total_pixels:
            raise VideoDecodeError(
                f"video's sampled frames hold over {limits.max_total_pixels} pixels",
                "video_max_total_pixels",
            )
        if frame is not self._last:
            self._keep(frame)
        self.slots.append(len(self.distinct) - 1)

    def _keep(self, frame) -> None:
        assert self.size is not None
        width, height = self.size
        kept = (len(self.distinct) + 1) * width * height * 3
        if kept > self.limits.max_decoded_bytes:
            raise VideoDecodeError(
                f"video's decoded frames come to over {self.limits.max_decoded_bytes} bytes",
                "video_max_inflight_bytes",
            )
        rgb = frame.to_ndarray(format="rgb24")
        image = Image.fromarray(rgb).resize(self.size, Image.Resampling.BICUBIC)
        del rgb
        self.store.keep(np.asarray(image, dtype=np.uint8))
        self._last = frame

    def pad(self) -> None:
        """A short last group repeats its last frame."""
        while len(self.slots) % self.sampling.temporal_patch_size:
            self.slots.append(self.slots[-1])


def _sample(container, limits, sampling: VideoSampling, started: float, store: FrameStore):
    stream = _video_stream(container)
    declared = _declared_duration(container, stream)
    if declared is not None and declared > limits.max_duration_s:
        raise VideoDecodeError(
            f"video lasts {declared:.1f} s, over the limit of {limits.max_duration_s} s",
            "video_max_duration_s",
        )
    grid = _Grid(limits, sampling, store)
    source: tuple[int, int] | None = None
    first_t: float | None = None
    previous = None  # (t, frame) of the last decoded frame not yet passed by the grid
    decoded = 0
    last_t = 0.0
    for frame in container.decode(stream):
        decoded += 1
        if time.monotonic() - started > limits.max_decode_s:
            raise VideoDecodeError(
                f"video took over {limits.max_decode_s} s to decode", "video_max_decode_s"
            )
        if frame.width * frame.height > limits.max_frame_pixels:
            raise VideoDecodeError(
                f"video frame is {frame.width}x{frame.height} = {frame.width * frame.height} "
                f"pixels, over the limit of {limits.max_frame_pixels}",
                "video_max_frame_pixels",
            )
        if source is None:
            source = (frame.width, frame.height)
            grid.size = sampling.resized(frame.width, frame.height)
        elif (frame.width, frame.height) != source:
            raise VideoDecodeError(
                f"video frame size changes from {source[0]}x{source[1]} to "
                f"{frame.width}x{frame.height}"
            )
        t = _frame_time(frame, stream, decoded)
        if first_t is None:
            first_t = t
        t -= first_t
        if t < last_t:  # out of order timestamps: the stream's clock cannot be trusted
            raise VideoDecodeError(
                f"video frame times go backwards ({t:.3f} s after {last_t:.3f} s)"
            )
        last_t = t
        if t > limits.max_duration_s:
            raise VideoDecodeError(
                f"video holds a frame at {t:.1f} s, over the limit of {limits.max_duration_s} s",
                "video_max_duration_s",
            )
        if declared is not None and t > declared + _DURATION_SLACK_S:
            raise VideoDecodeError(
                f"video stream declares {declared:.1f} s but holds a frame at {t:.1f} s"
            )
        # Every grid time up to this frame takes the nearer of it and the previous frame
        # (ties to the earlier): the same frame serves several grid times below the fps.
        while len(grid.slots) / sampling.fps <= t:
            grid_t = len(grid.slots) / sampling.fps
            if previous is not None and grid_t - previous[0] <= t - grid_t:
                grid.take(previous[1])
            else:
                grid.take(frame)
        previous = (t, frame)
    if source is None or not grid.slots:
        raise VideoDecodeError("the video stream has no decodable frame")
    grid.pad()
    groups = len(grid.slots) // sampling.temporal_patch_size
    if groups > limits.max_groups:
        raise VideoDecodeError(
            f"video has {groups} frame groups, over the limit of {limits.max_groups}",
            limits.groups_setting,
        )
    return SampledVideo(grid.distinct, grid.slots, sampling, decoded, last_t)


def _declared_duration(container, stream) -> float | None:
    if stream.duration is not None and stream.time_base is not None:
        return float(stream.duration * stream.time_base)
    if container.duration is not None:
        return container.duration / 1_000_000  # AV_TIME_BASE
    return None


def _frame_time(frame, stream, index: int) -> float:
    if frame.time is not None:
        return float(frame.time)
    rate = stream.average_rate or stream.guessed_rate
    if not rate:
        raise VideoDecodeError("video frames carry no timestamps and the stream no frame rate")
    return (index - 1) / float(rate)
