"""A sampled video's frames carried from a decode worker to the gateway's process without a
copy of the whole (docs/design.md §2, "Video", memory).

The worker keeps each distinct frame, resized, straight into one shared-memory segment
(`SharedFrames`, sized at the video's reserved bytes: tmpfs holds only the pages written),
closes its own mapping and hands over only the segment's name and the frames' layout
(`SharedVideo`). The gateway maps the segment read-only, removes its name at once and
refers to the frames in place; the memory is returned when the last frame is dropped. So a
video's frames exist once in each process while it is decoded, and once in the gateway
afterwards, never as a pickle of the whole.
"""

from __future__ import annotations

import contextlib
import mmap
import os
from dataclasses import dataclass
from multiprocessing.shared_memory import SharedMemory

import numpy as np

from iris.multimodal.video import FrameStore, SampledVideo, VideoLimits, VideoSampling

_SHM_DIR = "/dev/shm"  # where POSIX shared memory lives on Linux


@dataclass(frozen=True)
class SharedVideo:
    """A sampled video whose distinct frames lie one after another in segment `name`."""

    name: str
    count: int  # distinct frames
    height: int
    width: int
    slots: list[int]
    sampling: VideoSampling
    source_frames: int
    duration_s: float


class SharedFrames(FrameStore):
    """In a worker: frames kept in one segment, created at the first frame with room for
    what `limits` allow (`max_decoded_bytes`, at most `max_frames` frames of its size)."""

    def __init__(self, limits: VideoLimits) -> None:
        self.limits = limits
        self.segment: SharedMemory | None = None
        self.used = 0

    def keep(self, frame: np.ndarray) -> np.ndarray:
        if self.segment is None:
            most = self.limits.max_frames * frame.nbytes
            self.segment = SharedMemory(create=True, size=min(self.limits.max_decoded_bytes, most))
        kept = np.ndarray(frame.shape, np.uint8, buffer=self.segment.buf, offset=self.used)
        kept[...] = frame
        self.used += frame.nbytes
        return kept

    def hand_over(self, video: SampledVideo) -> SharedVideo:
        """The video's layout for the gateway; this process's mapping is closed."""
        assert self.segment is not None
        shared = SharedVideo(
            self.segment.name,
            len(video.distinct),
            video.height,
            video.width,
            video.slots,
            video.sampling,
            video.source_frames,
            video.duration_s,
        )
        video.distinct.clear()  # the views into the segment, before it is closed
        self.segment.close()
        return shared

    def remove(self) -> None:
        """The decode failed: the segment goes."""
        if self.segment is not None:
            with contextlib.suppress(BufferError):
                self.segment.close()
            remove(self.segment.name)


def receive(shared: SharedVideo) -> SampledVideo:
    """In the gateway: the video over the segment, mapped read-only; its name is removed
    now, its memory when the last frame is dropped."""
    frame = shared.height * shared.width * 3
    fd = os.open(os.path.join(_SHM_DIR, shared.name), os.O_RDONLY)
    try:
        mapped = mmap.mmap(fd, shared.count * frame, access=mmap.ACCESS_READ)
    finally:
        os.close(fd)
        remove(shared.name)
    shape = (shared.height, shared.width, 3)
    distinct = [
        np.frombuffer(mapped, np.uint8, count=frame, offset=k * frame).reshape(shape)
        for k in range(shared.count)
    ]
    return SampledVideo(
        distinct, shared.slots, shared.sampling, shared.source_frames, shared.duration_s
    )


def remove(name: str) -> None:
    """Remove segment `name` (and its entry in the resource tracker), if it is still there."""
    with contextlib.suppress(FileNotFoundError):
        segment = SharedMemory(name=name)
        segment.close()
        segment.unlink()
