"""A large request body kept in shared memory as it arrives, for a parse worker process to
read without the gateway's process ever holding it as one `bytes` (docs/design/door.md).

Joining a 16 MB body's chunks, or pickling it to a worker, is one copy of the whole under
the GIL (and, on fresh memory, a page fault per 4 KiB): the event loop would wait for it.
Here each chunk is copied into the segment as it arrives, a bounded copy per chunk.

A segment holds /dev/shm only as long as its body needs it (docs/design/door.md): it is
sized from the request's Content-Length rounded up to a page; without one it starts at
1 MiB and is re-allocated at twice the size (what arrived copied over) up to the body
limit; and the route frees it as soon as the parse returns, before the request is routed
(gateway/parsing/route.py), not when a stream ends minutes later.
"""

from __future__ import annotations

import asyncio
import contextlib
import mmap
import os
from multiprocessing.shared_memory import SharedMemory

FIRST_SEGMENT_BYTES = 1024 * 1024  # a body of unknown size (chunked) starts here
COPY_WINDOW_BYTES = 1024 * 1024  # a re-allocation copies this much per turn of the loop


def page_rounded(size: int) -> int:
    """`size` rounded up to a whole number of pages."""
    return -(-size // mmap.PAGESIZE) * mmap.PAGESIZE


class SharedBody:
    """A shared-memory segment of `capacity` bytes, its pages reserved up front (a segment
    past /dev/shm's room is refused at `create`, never a SIGBUS at a later write), filled
    by `write`; `size` bytes are the body. `release` unmaps and removes it."""

    def __init__(self, segment: SharedMemory) -> None:
        self.segment = segment
        self.size = 0
        self._released = False

    @classmethod
    async def create(cls, capacity: int) -> SharedBody | None:
        """A segment for up to `capacity` bytes, or None when /dev/shm has no room."""
        try:
            segment = SharedMemory(create=True, size=max(capacity, 1))
        except OSError:
            return None
        # Reserving the pages zeroes them: a syscall without the GIL, off the loop.
        reserving = asyncio.ensure_future(
            asyncio.to_thread(os.posix_fallocate, segment._fd, 0, segment.size)
        )
        try:
            await asyncio.shield(reserving)
        except OSError:
            _remove(segment)
            return None
        except BaseException:
            # The request went away: the segment goes once the thread is done with its fd.
            reserving.add_done_callback(lambda _: _remove(segment))
            raise
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

    async def grown(self, capacity: int) -> SharedBody | None:
        """This body in a new segment of `capacity` bytes, copied a window at a time (the
        loop runs between windows), this one released; None when /dev/shm has no room
        (this one is kept)."""
        bigger = await SharedBody.create(capacity)
        if bigger is None:
            return None
        try:
            for start in range(0, self.size, COPY_WINDOW_BYTES):
                end = min(start + COPY_WINDOW_BYTES, self.size)
                bigger.segment.buf[start:end] = self.segment.buf[start:end]
                await asyncio.sleep(0)
        except BaseException:  # cancelled while it grew: the new segment is nobody's
            bigger.release()
            raise
        bigger.size = self.size
        self.release()
        return bigger

    def to_bytes(self) -> bytes:
        """The body as one `bytes`: a copy of the whole, for the rare body the parse pool
        does not take (not JSON)."""
        return bytes(self.segment.buf[: self.size])

    def release(self) -> None:
        """Unmap and remove the segment (once: the route and the door both release it)."""
        if not self._released:
            self._released = True
            _remove(self.segment)


def _remove(segment: SharedMemory) -> None:
    with contextlib.suppress(BufferError, OSError):
        segment.close()
    with contextlib.suppress(FileNotFoundError):
        segment.unlink()


class BodyBuffer:
    """A body's chunks as they arrive: kept in a list up to `spill_over` bytes (None: no
    limit), then in a SharedBody (the first chunks copied in) sized from `expected` (the
    Content-Length, when the request sent one) or FIRST_SEGMENT_BYTES, grown by doubling up
    to `max_bytes` (the route's body limit). `body` is then the joined small body, or the
    SharedBody. With no room in /dev/shm the body stays in memory."""

    def __init__(self, spill_over: int | None, max_bytes: int, expected: int | None = None):
        self.spill_over = spill_over
        self.limit = page_rounded(max(max_bytes, 1))
        self.expected = expected
        self.chunks: list[bytes] = []
        self.kept = 0
        self.shared: SharedBody | None = None
        self._no_room = False

    async def add(self, chunk: bytes) -> None:
        if self.shared is not None:
            if self.shared.write(chunk):
                return
            if await self._grow(self.shared.size + len(chunk)) and self.shared.write(chunk):
                return
            self._to_memory()
        self.chunks.append(chunk)
        self.kept += len(chunk)
        if (
            self.shared is None
            and not self._no_room
            and self.spill_over is not None
            and self.kept > self.spill_over
        ):
            await self._spill()

    async def _spill(self) -> None:
        first = page_rounded(self.expected) if self.expected else FIRST_SEGMENT_BYTES
        shared = await SharedBody.create(min(max(first, page_rounded(self.kept)), self.limit))
        if shared is None:
            self._no_room = True  # kept in memory, as without a pool
            return
        for kept in self.chunks:
            if not shared.write(kept):  # over the limit: refused by size anyway
                shared.release()
                self._no_room = True
                return
        self.shared, self.chunks = shared, []

    async def _grow(self, needed: int) -> bool:
        """Re-allocate the segment at twice its size (repeatedly) to hold `needed` bytes,
        up to the limit; False when it cannot."""
        assert self.shared is not None
        capacity = self.shared.capacity
        while capacity < needed and capacity < self.limit:
            capacity = min(capacity * 2, self.limit)
        if capacity < needed:
            return False
        grown = await self.shared.grown(capacity)
        if grown is None:
            return False
        self.shared = grown
        return True

    def _to_memory(self) -> None:
        """Move what the segment holds back into memory (no room to grow it)."""
        assert self.shared is not None
        self.chunks, self.kept = [self.shared.to_bytes()], self.shared.size
        self.release()
        self._no_room = True

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
