"""Per-key admission: a token bucket per API key for requests and for prompt tokens, so
one key cannot take every slot of the gateway (the capacity-based overload check is a
separate, gateway-wide matter).

Each bucket refills at its rate up to its burst. A request is admitted while its key's
request bucket holds a whole request and its prompt-token bucket is out of debt; it takes
one request at once and, once its prompt is tokenized, its prompt tokens — which may run
the bucket into debt, so a prompt larger than the burst is still served once, and the key
then waits until the debt is repaid. A refusal is a 429 whose Retry-After is when the
bucket can admit again. A rate of 0 turns its bucket off.
"""

from __future__ import annotations

import math
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from gateway.errors import APIError

# Bounded: an attacker cycling through invalid keys never gets this far (401 first), but
# anonymous traffic and many valid keys must not grow memory without end.
MAX_TRACKED_KEYS = 10_000


@dataclass
class Bucket:
    level: float
    updated: float

    def refill(self, now: float, rate: float, burst: float) -> None:
        self.level = min(burst, self.level + (now - self.updated) * rate)
        self.updated = now


class KeyLimits:
    """Request and prompt-token buckets per key id (None: the anonymous caller)."""

    def __init__(
        self,
        *,
        requests_per_s: float,
        request_burst: float,
        prompt_tokens_per_s: float,
        prompt_token_burst: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.rates = {"requests": requests_per_s, "prompt tokens": prompt_tokens_per_s}
        self.bursts = {"requests": request_burst, "prompt tokens": prompt_token_burst}
        self.clock = clock
        self._buckets: OrderedDict[tuple[str | None, str], Bucket] = OrderedDict()

    @property
    def enabled(self) -> bool:
        return any(rate > 0 for rate in self.rates.values())

    def _bucket(self, key_id: str | None, kind: str, now: float) -> Bucket:
        slot = (key_id, kind)
        bucket = self._buckets.get(slot)
        if bucket is None:
            bucket = self._buckets[slot] = Bucket(self.bursts[kind], now)
            while len(self._buckets) > MAX_TRACKED_KEYS:
                self._buckets.popitem(last=False)
        else:
            self._buckets.move_to_end(slot)
            bucket.refill(now, self.rates[kind], self.bursts[kind])
        return bucket

    def admit(self, key_id: str | None) -> None:
        """Take one request from the key's bucket, or raise a 429 (nothing taken)."""
        now = self.clock()
        active = [kind for kind, rate in self.rates.items() if rate > 0]
        buckets = {kind: self._bucket(key_id, kind, now) for kind in active}
        for kind, bucket in buckets.items():
            # A request needs a whole token; prompt tokens only a bucket out of debt.
            if kind == "requests":
                refused, short = bucket.level < 1, 1 - bucket.level
            else:
                refused, short = bucket.level <= 0, -bucket.level
            if refused:
                retry_s = max(1, math.ceil(short / self.rates[kind]))
                raise APIError(
                    429,
                    f"this API key is over its rate of {self.rates[kind]:g} {kind} per second "
                    f"(burst {self.bursts[kind]:g}); retry in {retry_s} s",
                    code="rate_limit_exceeded",
                    retry_after=retry_s,
                )
        if "requests" in buckets:
            buckets["requests"].level -= 1

    def level(self, key_id: str | None, kind: str) -> float:
        """What the key's `kind` bucket ("requests" or "prompt tokens") holds now."""
        return self._bucket(key_id, kind, self.clock()).level

    def charge_prompt_tokens(self, key_id: str | None, tokens: int) -> None:
        """Take an admitted request's prompt tokens (the bucket may go into debt)."""
        if self.rates["prompt tokens"] > 0:
            self._bucket(key_id, "prompt tokens", self.clock()).level -= tokens
