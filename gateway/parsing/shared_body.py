"""A large request body kept in shared memory as it arrives, for a parse worker process to
read without the gateway's process ever holding it as one `bytes` (docs/design/door.md).

Joining a 16 MB body's chunks, or pickling it to a worker, is one copy of the whole under
the GIL (and, on fresh memory, a page fault per 4 KiB): the event loop would wait for it.
Here each chunk is copied into the segment as it arrives, a bounded copy per chunk.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from multiprocessing.shared_memory import SharedMemory


class SharedBody:
    """A shared-memory segment of `capacity` bytes, its pages reserved up front (a segment
    past /dev/shm's room is refused at `create`, never a SIGBUS at a later write), filled
    by `write`; `size` bytes are the body. `release` unmaps and removes it."""

    def __init__(self, segment: SharedMemory) -> None:
        self.segment = segment
        self.size = 0

    @classmethod
    async def create(cls, capacity: int) -> SharedBody | None:
        """A segment for up to `capacity` bytes, or None when /dev/shm has no room."""
        try:
            segment = SharedMemory(create=True, size=max(capacity, 1))
        except OSError:
            return None
        try:
            # Reserving the pages zeroes them: a syscall without the GIL, off the loop.
            await asyncio.to_thread(os.posix_fallocate, segment._fd, 0, segment.size)
        except OSError:
            _remove(segment)
            return None
        return cls(segment)

    @property
    def name(self) -> str:
        return self.segment.name

    @property
    def capacity(self) -> int:
        return self.segment.size

    def write(self, chunk: bytes) -> bool:
        """Append `chunk`; False (nothing written) when it does not fit."""
        end = self.size + len(chunk)
        if end > self.segment.size:
            return False
        self.segment.buf[self.size : end] = chunk
        self.size = end
        return True

    def to_bytes(self) -> bytes:
        """The body as one `bytes`: a copy of the whole, for the rare body the parse pool
        does not take (not JSON)."""
        return bytes(self.segment.buf[: self.size])

    def release(self) -> None:
        _remove(self.segment)


def _remove(segment: SharedMemory) -> None:
    with contextlib.suppress(BufferError, OSError):
        segment.close()
    with contextlib.suppress(FileNotFoundError):
        segment.unlink()


class BodyBuffer:
    """A body's chunks as they arrive: kept in a list up to `spill_over` bytes (None: no
    limit), then in a SharedBody of `capacity` bytes (the first chunks copied in). `body`
    is then the joined small body, or the SharedBody."""

    def __init__(self, spill_over: int | None, capacity: int) -> None:
        self.spill_over = spill_over
        self.capacity = capacity
        self.chunks: list[bytes] = []
        self.kept = 0
        self.shared: SharedBody | None = None
        self._no_room = False

    async def add(self, chunk: bytes) -> None:
        if self.shared is not None and self.shared.write(chunk):
            return
        self.chunks.append(chunk)
        self.kept += len(chunk)
        if (
            self.shared is None
            and not self._no_room
            and self.spill_over is not None
            and self.kept > self.spill_over
        ):
            shared = await SharedBody.create(self.capacity)
            if shared is None:
                self._no_room = True  # kept in memory, as without a pool
                return
            for kept in self.chunks:
                if not shared.write(kept):  # over the capacity: refused by size anyway
                    shared.release()
                    self._no_room = True
                    return
            self.shared, self.chunks = shared, []

    def drop(self) -> None:
        """Forget what was kept (a body refused before its end)."""
        self.chunks, self.kept = [], 0
        self.release()

    def body(self) -> bytes | SharedBody:
        if self.shared is not None:
            return self.shared
        return b"".join(self.chunks)

    def release(self) -> None:
        if self.shared is not None:
            self.shared.release()
            self.shared = None
