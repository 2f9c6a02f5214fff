"""Capacity-based admission: a request goes only to a pod with room, and when no pod has
room it is refused at once (429 with Retry-After) instead of queueing without bound.

A pod has room while, by its in-flight ledger (this gateway's placements, counted the
moment they are made, plus what the pod's last load poll showed beyond them):

- its requests in flight (prefilling + decoding + others' running) are under
  `max_inflight`, and
- the prefill tokens queued on it (ours not yet at a first token + others' pending) are
  under `max_queued_prefill_tokens` (an empty queue takes any one prompt, however long).

A bound of 0 is no bound. Retry-After is when the soonest pod will have room at the rate it
was measured to drain (gateway/routing/inflight.py: streams completing per second for the
request bound, prompt tokens reaching a first token per second for the token bound),
rounded up to whole seconds within [1, max_retry_after_s]; with nothing measured yet it is
`default_retry_after_s`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from gateway.errors import APIError
from gateway.routing.inflight import InflightView
from gateway.routing.pods import Pod


@dataclass(frozen=True)
class PodCapacity:
    """The per-pod bounds and the Retry-After limits (from GatewaySettings)."""

    max_inflight: int = 0
    max_queued_prefill_tokens: int = 0
    default_retry_after_s: int = 1
    max_retry_after_s: int = 30

    def with_room(self, pods: Sequence[Pod]) -> list[Pod]:
        """The pods that may take one more request; 429 (Retry-After) when none may."""
        if not pods or (self.max_inflight == 0 and self.max_queued_prefill_tokens == 0):
            return list(pods)
        views = [(pod, pod.inflight.view()) for pod in pods]
        roomy = [pod for pod, view in views if self._excess(view) == (0, 0)]
        if roomy:
            return roomy
        waits = [self._wait_s(pod, view) for pod, view in views]
        known = [wait for wait in waits if wait is not None]
        retry = self._retry_after(min(known) if known else None)
        loads = ", ".join(self._describe(pod, view) for pod, view in views)
        raise APIError(
            429,
            f"every LLM pod is at capacity ({loads}); retry after {retry} s",
            code="overloaded",
            retry_after=retry,
        )

    def _excess(self, view: InflightView) -> tuple[int, int]:
        """(requests, prefill tokens) over the bounds; (0, 0) when the pod has room."""
        requests = view.requests + view.others_running
        tokens = view.prefill_tokens + view.others_prefill_tokens
        over_requests = over_tokens = 0
        if self.max_inflight and requests >= self.max_inflight:
            over_requests = requests - self.max_inflight + 1
        if self.max_queued_prefill_tokens and tokens >= self.max_queued_prefill_tokens:
            over_tokens = tokens - self.max_queued_prefill_tokens + 1
        return over_requests, over_tokens

    def _wait_s(self, pod: Pod, view: InflightView) -> float | None:
        """Seconds until `pod` has room at its measured drain rates (None: not measured)."""
        over_requests, over_tokens = self._excess(view)
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
    def _describe(pod: Pod, view: InflightView) -> str:
        requests = view.requests + view.others_running
        tokens = view.prefill_tokens + view.others_prefill_tokens
        return f"{pod.address}: {requests} requests, {tokens} prefill tokens queued"
