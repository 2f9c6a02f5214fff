"""A sampled video's frames carried from a decode worker to the gateway's process without a
copy of the whole (docs/design/multimodal.md, "Video", memory).

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
SEGMENT_PREFIX = "iris-vf-"  # the gateway names each decode's segment: iris-vf-<its pid>-<uuid>


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
    """In a worker: frames kept in segment `name` (chosen by the gateway, which removes it
    whatever becomes of the worker), created at the first frame with room for
    what `limits` allow (`max_decoded_bytes`, at most `max_frames` frames of its size).
    Each frame's pages are reserved before it is written (a full /dev/shm is an OSError
    there, never a SIGBUS later); when they cannot be, the frames move to the worker's own
    memory and the video goes back pickled, as any result does."""

    def __init__(self, limits: VideoLimits, name: str) -> None:
        super().__init__()
        self.limits = limits
        self.name = name
        self.segment: SharedMemory | None = None
        self.shared = True
        self.used = 0

    def keep(self, frame: np.ndarray) -> None:
        if self.shared and not self._reserve(frame.nbytes):
            self._leave_shared_memory()
        if not self.shared:
            self.frames.append(frame)
            return
        assert self.segment is not None
        kept = np.ndarray(frame.shape, np.uint8, buffer=self.segment.buf, offset=self.used)
        kept[...] = frame
        self.used += frame.nbytes
        self.frames.append(kept)

    def _reserve(self, nbytes: int) -> bool:
        try:
            if self.segment is None:
                most = self.limits.max_frames * nbytes
                size = min(self.limits.max_decoded_bytes, most)
                self.segment = SharedMemory(self.name, create=True, size=max(size, nbytes))
            os.posix_fallocate(self.segment._fd, self.used, nbytes)
        except OSError:
            return False
        return True

    def _leave_shared_memory(self) -> None:
        for index, frame in enumerate(self.frames):
            self.frames[index] = frame.copy()
        self.shared = False
        self.remove()

    def hand_over(self, video: SampledVideo) -> SharedVideo | SampledVideo:
        """The video's layout for the gateway (this process's mapping closed), or the video
        itself when its frames left shared memory."""
        if not self.shared:
            return video
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
        """The decode failed (or its frames moved out): the segment goes."""
        if self.segment is not None:
            with contextlib.suppress(BufferError):
                self.segment.close()
            remove(self.segment.name)
            self.segment = None


def receive(shared: SharedVideo | SampledVideo) -> SampledVideo:
    """In the gateway: the video over the segment, mapped read-only; its name is removed
    now, its memory when the last frame is dropped."""
    if isinstance(shared, SampledVideo):  # it came pickled: /dev/shm had no room
        return shared
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
