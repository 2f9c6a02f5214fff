"""The gateway-wide bound on decoded video bytes in flight (`video_max_inflight_bytes`).

Before a request's videos are decoded they reserve, together and at once, what their frames
will take once resized (from each header: grid frames x target width x height x 3; without
a duration, a share of the bound): one reservation per request, so a request never waits
for memory that only its own frames hold. A reservation that does not fit waits, first
come first served, up to `video_queue_timeout_s`, then the request gets a 503 with
Retry-After. As each video is decoded its frames take their part of it (`hold_part`),
which lasts as long as they do: it is released when the sampled video is freed (whichever
thread drops it), so the bound counts what the gateway's process holds, not what a request
thinks it holds; what no frame took is released when the decodes end.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import weakref

from gateway import metrics
from gateway.errors import APIError, bad_request


class VideoMemory:
    """Bytes of decoded frames held or reserved, at most `limit`; used on the event loop."""

    def __init__(self, limit: int, timeout_s: float, retry_after_s: int = 1) -> None:
        self.limit = limit
        self.timeout_s = timeout_s
        self.retry_after_s = retry_after_s
        self.used = 0
        self._waiting: collections.deque[tuple[int, asyncio.Future]] = collections.deque()

    async def reserve(self, nbytes: int, param: str) -> Reservation:
        """`nbytes` reserved, once they fit; a 400 for more than the whole bound, a 503 with
        Retry-After when they did not fit within the timeout."""
        if nbytes > self.limit:
            metrics.VIDEO_REFUSALS.labels("video_max_inflight_bytes").inc()
            raise bad_request(
                f"{param}: the video's frames would take {nbytes} bytes once decoded, over the "
                f"limit of {self.limit} (video_max_inflight_bytes)",
                param,
                "invalid_video",
            )
        loop = asyncio.get_running_loop()
        if not self._waiting and self.used + nbytes <= self.limit:
            self._take(nbytes)
            return Reservation(self, loop, nbytes)
        waiter = (nbytes, loop.create_future())
        self._waiting.append(waiter)
        try:
            async with asyncio.timeout(self.timeout_s):
                await asyncio.shield(waiter[1])
        except (TimeoutError, asyncio.CancelledError) as err:
            if waiter[1].done():  # granted as the wait ended: it is ours to hand back
                if isinstance(err, TimeoutError):
                    return Reservation(self, loop, nbytes)
                self.release(nbytes)
                raise
            self._waiting.remove(waiter)
            self._grant()  # the head may have been waiting behind this one
            if isinstance(err, asyncio.CancelledError):
                raise
            metrics.VIDEO_REFUSALS.labels("video_queue_timeout_s").inc()
            raise APIError(
                503,
                f"this request's videos need {nbytes} bytes of decoded frames, and "
                f"{self.used} of the limit of {self.limit} bytes (video_max_inflight_bytes) "
                f"were in use after it waited {self.timeout_s:g} s (video_queue_timeout_s); "
                "send the request again",
                param=param,
                code="overloaded",
                retry_after=self.retry_after_s,
            ) from None
        return Reservation(self, loop, nbytes)

    def release(self, nbytes: int) -> None:
        """Hand back `nbytes` (on the loop) and wake the waiters that now fit."""
        self.used -= nbytes
        metrics.VIDEO_INFLIGHT_BYTES.set(self.used)
        self._grant()

    def _take(self, nbytes: int) -> None:
        self.used += nbytes
        metrics.VIDEO_INFLIGHT_BYTES.set(self.used)

    def _grant(self) -> None:
        while self._waiting and self.used + self._waiting[0][0] <= self.limit:
            nbytes, future = self._waiting.popleft()
            self._take(nbytes)
            future.set_result(None)


class Reservation:
    """A request's share of the bound: `hold_part` for each video's frames as they are
    decoded, `release` what is left when the decodes end (all of it when one failed)."""

    def __init__(self, memory: VideoMemory, loop: asyncio.AbstractEventLoop, nbytes: int):
        self.memory = memory
        self.loop = loop
        self.nbytes = nbytes

    def hold_part(self, owner: object, nbytes: int) -> None:
        """`nbytes` of this reservation (never more than is left: each decode was bounded
        by its part) now belong to `owner`: released when it is freed, from whichever thread
        frees it."""
        assert 0 <= nbytes <= self.nbytes, (nbytes, self.nbytes)
        self.nbytes -= nbytes
        weakref.finalize(owner, _release_from_any_thread, self.memory, self.loop, nbytes)

    def release(self) -> None:
        """Hand back what no video's frames took."""
        self.memory.release(self.nbytes)
        self.nbytes = 0


def _release_from_any_thread(memory: VideoMemory, loop, nbytes: int) -> None:
    with contextlib.suppress(RuntimeError):  # the loop is closed: nothing left to wake
        loop.call_soon_threadsafe(memory.release, nbytes)
