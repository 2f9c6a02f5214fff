"""Domain types of the encoder: one image to encode, and what became of it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# Work is deduplicated by (item key, expected token count): the same image expected with
# another token count is other work (and one of the two will fail its row check).
JobKey = tuple[bytes, int]


@dataclass(frozen=True)
class EncodeJob:
    """One image to encode: its cache key (identity, or 8-byte hash), the token count the
    caller expects, the caller's grid (may be empty) and the encoded image file."""

    key: bytes
    token_count: int
    grid: tuple[int, ...]
    image: bytes
    video: bool = False  # `image` is one packed frame group (iris.multimodal.video)

    @property
    def job_key(self) -> JobKey:
        return (self.key, self.token_count)


@dataclass(frozen=True)
class Outcome:
    """What became of a job: stored as an embedding (ok), as failed(error), or, when
    `retryable`, not stored at all (the cache refused the put; the lease was abandoned)."""

    key: bytes
    ok: bool
    error: str = ""
    retryable: bool = False


@dataclass
class Prepared:
    """A job whose image is decoded and preprocessed, ready for the vision tower."""

    job: EncodeJob
    image: Any  # the runner's PreparedImage


class ItemFailure(Exception):
    """This one item cannot be encoded; `reason` is stored as its failed(reason) entry and
    `kind` is the bounded label the failure is counted under (decode, token_count, ...)."""

    def __init__(self, kind: str, reason: str) -> None:
        super().__init__(reason)
        self.kind = kind
        self.reason = reason


class QueueFull(Exception):
    """Accepting this work would exceed the queue's vision-token bound; retry later."""

    def __init__(self, needed: int, queued: int, limit: int, retry_after_ms: int) -> None:
        super().__init__(
            f"encoder queue full: {needed} new vision tokens with {queued} queued exceeds "
            f"the limit of {limit}; retry after {retry_after_ms} ms"
        )
        self.retry_after_ms = retry_after_ms


class ShuttingDown(Exception):
    """The encoder is stopping and accepts no new work."""
