"""Per-key admission: a token bucket per API key for requests, prompt tokens and
completion tokens, so one key cannot take every slot of the gateway (the capacity-based
overload check is a separate, gateway-wide matter).

Each bucket refills at its rate up to its burst. A request is admitted while its key's
request bucket holds a whole request and its token buckets are out of debt; it takes one
request at once; once its prompt is tokenized, n x its prompt tokens (each of the n
choices is routed and prefilled on its own); and each completion token as the pods
produce it. Token charges may run a bucket into debt, so a prompt or an answer larger than
the burst is still served once, and the key then waits until the debt is repaid. A
refusal is a 429 whose Retry-After is when the bucket can admit again. A rate of 0 turns
its bucket off. Buckets live in one gateway process (the chart divides each rate by the
number of gateway replicas).
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
    """Request, prompt-token and completion-token buckets per key id (None: anonymous)."""

    def __init__(
        self,
        *,
        requests_per_s: float,
        request_burst: float,
        prompt_tokens_per_s: float,
        prompt_token_burst: float,
        completion_tokens_per_s: float = 0.0,
        completion_token_burst: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.rates = {
            "requests": requests_per_s,
            "prompt tokens": prompt_tokens_per_s,
            "completion tokens": completion_tokens_per_s,
        }
        self.bursts = {
            "requests": request_burst,
            "prompt tokens": prompt_token_burst,
            "completion tokens": completion_token_burst,
        }
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
            # A request needs a whole token; token buckets only to be out of debt.
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
        """Take an admitted request's prompt tokens, n x the prompt's (may go into debt)."""
        self._charge(key_id, "prompt tokens", tokens)

    def take_prompt_tokens(self, key_id: str | None, tokens: int) -> None:
        """Take tokens before the work they pay for (a video's decode, from its header):
        a 429 when the key's prompt-token bucket is already in debt (the admission rule,
        applied again where the work starts), else charged (may go into debt)."""
        kind = "prompt tokens"
        rate = self.rates[kind]
        if rate <= 0:
            return
        bucket = self._bucket(key_id, kind, self.clock())
        if bucket.level <= 0:
            retry_s = max(1, math.ceil(-bucket.level / rate))
            raise APIError(
                429,
                f"this API key is over its rate of {rate:g} {kind} per second "
                f"(burst {self.bursts[kind]:g}); retry in {retry_s} s",
                code="rate_limit_exceeded",
                retry_after=retry_s,
            )
        bucket.level -= tokens

    def charge_completion_tokens(self, key_id: str | None, tokens: int) -> None:
        """Take tokens a pod produced for the key, as they come (may go into debt)."""
        self._charge(key_id, "completion tokens", tokens)

    def _charge(self, key_id: str | None, kind: str, tokens: int) -> None:
        # Negative when a charge taken ahead (a video's planned tokens) is settled lower.
        if self.rates[kind] > 0:
            bucket = self._bucket(key_id, kind, self.clock())
            bucket.level = min(self.bursts[kind], bucket.level - tokens)
