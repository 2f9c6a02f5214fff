"""Wakes Wait calls when this service changes an entry, so local Put/Fail release waiters
at once; changes made elsewhere (another replica, an expired lease) are found by polling
with a short exponential backoff (2 ms doubling to 50 ms), never a hard spin."""

from __future__ import annotations

import asyncio
import contextlib

FIRST_POLL_S = 0.002
MAX_POLL_S = 0.05


class Notifier:
    """A generation event: `changed()` wakes everyone waiting on the current generation.

    Take `generation()` before looking at the store and wait on it after, so a change
    that lands while the look is in flight is not missed."""

    def __init__(self) -> None:
        self._event = asyncio.Event()

    def changed(self) -> None:
        self._event.set()
        self._event = asyncio.Event()

    def generation(self) -> asyncio.Event:
        return self._event

    @staticmethod
    async def wait_change(generation: asyncio.Event, timeout_s: float) -> None:
        """Return once `generation` has changed or after timeout_s, whichever is first."""
        if timeout_s <= 0 or generation.is_set():
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(generation.wait(), timeout_s)


def next_poll(current_s: float) -> float:
    return min(current_s * 2, MAX_POLL_S)
