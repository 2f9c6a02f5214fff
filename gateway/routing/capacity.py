"""Capacity-based admission: a request goes only to a pod with room, and when no pod has
room it is refused at once (429 with Retry-After) instead of queueing without bound.

A pod has room while, by its in-flight ledger (this gateway's placements, counted the
moment they are made, plus what the pod's last load poll showed beyond them):

- its requests in flight (prefilling + decoding + others' running) are under its request
  limit, and
- the prefill tokens queued on it (ours not yet at a first token + others' pending) are
  under `max_queued_prefill_tokens` (an empty queue takes any one prompt, however long).

The request limit adapts to what the pod can do (`AdaptiveLimit`): while the pod is at its
limit, it grows while first tokens come within `wait_factor` x the pod's floor (the 10th
percentile of its recent routing-to-first-token waits) and shrinks while they come later,
between 1 and `max_inflight`. So
past its capacity a pod stops taking requests that would only wait, whatever hardware it
runs on. `wait_factor` 0 keeps the limit at `max_inflight`; a bound of 0 is no bound.

Retry-After is when the soonest pod will have room at the rate it was measured to drain
(gateway/routing/inflight.py: streams completing per second for the request limit, prompt
tokens reaching a first token per second for the token bound), rounded up to whole seconds
within [1, max_retry_after_s]; with nothing measured yet it is `default_retry_after_s`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from gateway.errors import APIError
from gateway.routing.inflight import InflightLedger, InflightView
from gateway.routing.pods import Pod

START_LIMIT = 8.0
DECREASE = 0.9  # the limit's factor for each first token while recent ones come late
RECENT = 8  # first tokens whose median is held against the target (one late one is noise)


class AdaptiveLimit:
    """One pod's request limit, additive increase / multiplicative decrease on its
    first-token waits. For each new wait: when the median of the last RECENT is over
    `factor` x the floor (the 10th percentile of the recent waits: the least ones are
    luck, not the pod), x DECREASE; else, if the pod was using
    its limit (a limit nobody reaches says nothing about more), +1/limit. Within
    [1, ceiling]."""

    def __init__(self, ceiling: float, factor: float) -> None:
        self.ceiling = ceiling
        self.factor = factor
        self.value = min(START_LIMIT, ceiling)
        self._seen = 0

    def update(self, ledger: InflightLedger, in_flight: int) -> float:
        """Take in the waits the ledger saw since the last call (`in_flight`: the pod's
        requests now); the limit now."""
        waits = ledger.first_token_waits
        fresh = min(ledger.first_tokens - self._seen, len(waits))
        self._seen = ledger.first_tokens
        if fresh <= 0:
            return self.value
        if in_flight + 1 < self.value:
            return self.value  # the limit binds nothing now: the waits say nothing of it
        ordered = list(waits)
        target = self.factor * sorted(ordered)[len(ordered) // 10]
        for end in range(len(ordered) - fresh + 1, len(ordered) + 1):
            recent = sorted(ordered[max(0, end - RECENT) : end])
            if recent[(len(recent) - 1) // 2] > target:
                self.value = max(1.0, self.value * DECREASE)
            else:
                self.value = min(self.ceiling, self.value + 1.0 / self.value)
        return self.value


@dataclass
class PodCapacity:
    """The per-pod bounds, each pod's adaptive limit, and the Retry-After limits (from
    GatewaySettings). Loop-thread only."""

    max_inflight: int = 0
    max_queued_prefill_tokens: int = 0
    wait_factor: float = 0.0
    default_retry_after_s: int = 1
    max_retry_after_s: int = 30
    _limits: dict[str, AdaptiveLimit] = field(default_factory=dict, init=False, repr=False)

    def with_room(self, pods: Sequence[Pod]) -> list[Pod]:
        """The pods that may take one more request; 429 (Retry-After) when none may."""
        if not pods or (self.max_inflight == 0 and self.max_queued_prefill_tokens == 0):
            return list(pods)
        views = []
        for pod in pods:
            view = pod.inflight.view()
            views.append((pod, view, self.request_limit(pod, view)))
        roomy = [pod for pod, view, limit in views if self._excess(view, limit) == (0, 0)]
        if roomy:
            return roomy
        waits = [self._wait_s(pod, view, limit) for pod, view, limit in views]
        known = [wait for wait in waits if wait is not None]
        retry = self._retry_after(min(known) if known else None)
        loads = ", ".join(self._describe(pod, view, limit) for pod, view, limit in views)
        raise APIError(
            429,
            f"every LLM pod is at capacity ({loads}); retry after {retry} s",
            code="overloaded",
            retry_after=retry,
        )

    def request_limit(self, pod: Pod, view: InflightView | None = None) -> int:
        """How many requests `pod` may hold now (0: no bound)."""
        if not self.max_inflight or not self.wait_factor:
            return self.max_inflight
        limit = self._limits.get(pod.address)
        if limit is None:
            limit = self._limits[pod.address] = AdaptiveLimit(self.max_inflight, self.wait_factor)
        view = view or pod.inflight.view()
        in_flight = view.requests + view.others_running
        return max(1, math.floor(limit.update(pod.inflight, in_flight)))

    def _excess(self, view: InflightView, limit: int) -> tuple[int, int]:
        """(requests, prefill tokens) over the bounds; (0, 0) when the pod has room."""
        requests = view.requests + view.others_running
        tokens = view.prefill_tokens + view.others_prefill_tokens
        over_requests = over_tokens = 0
        if limit and requests >= limit:
            over_requests = requests - limit + 1
        if self.max_queued_prefill_tokens and tokens >= self.max_queued_prefill_tokens:
            over_tokens = tokens - self.max_queued_prefill_tokens + 1
        return over_requests, over_tokens

    def _wait_s(self, pod: Pod, view: InflightView, limit: int) -> float | None:
        """Seconds until `pod` has room at its measured drain rates (None: not measured)."""
        over_requests, over_tokens = self._excess(view, limit)
        waits = []
        for over, meter in ((over_requests, pod.inflight.completed),
                            (over_tokens, pod.inflight.prefilled)):  # fmt: skip
            if over:
                rate = meter.rate()
                if not rate:
                    return None
                waits.append(over / rate)
        return max(waits, default=0.0)

    def _retry_after(self, wait_s: float | None) -> int:
        if wait_s is None:
            return self.default_retry_after_s
        return min(self.max_retry_after_s, max(1, math.ceil(wait_s)))

    @staticmethod
    def _describe(pod: Pod, view: InflightView, limit: int) -> str:
        requests = view.requests + view.others_running
        tokens = view.prefill_tokens + view.others_prefill_tokens
        bound = f" of {limit}" if limit else ""
        return f"{pod.address}: {requests}{bound} requests, {tokens} prefill tokens queued"
