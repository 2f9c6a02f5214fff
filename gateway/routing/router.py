"""Run the plugin chain for one request and return the chosen pod with its prefix match."""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass

from gateway import metrics
from gateway.errors import APIError
from gateway.routing import regret
from gateway.routing.capacity import PodCapacity
from gateway.routing.config import RouterConfig
from gateway.routing.inflight import Ticket
from gateway.routing.kv_index import KVIndex
from gateway.routing.plugins.base import RoutingRequest
from gateway.routing.pods import Pod


@dataclass(frozen=True)
class Decision:
    """The chosen pod, how many leading prompt tokens its cached prefix covers, the
    placement's ticket in the pod's in-flight ledger (whoever holds the decision closes it
    when the request ends or goes elsewhere), and what the other pods held (regret.py)."""

    pod: Pod
    matched_tokens: int
    hashes: list[bytes]
    ticket: Ticket | None = None
    regret_basis: regret.Basis | None = None

    def release(self) -> None:
        """Close the placement's ticket: the request will not run here (idempotent)."""
        if self.ticket is not None:
            self.ticket.close()


@dataclass(eq=False)
class Router:
    """filter → capacity (pods with room, gateway/routing/capacity.py) → weighted scorers
    (clamped to [0, 1]) → picker, each plugin call timed. Without `capacity`, pods are
    unbounded and a 429's Retry-After is `retry_after_s`."""

    config: RouterConfig
    index: KVIndex
    retry_after_s: int = 1
    capacity: PodCapacity | None = None

    def __post_init__(self) -> None:
        if self.capacity is None:
            self.capacity = PodCapacity(default_retry_after_s=self.retry_after_s)

    def route(
        self, request: RoutingRequest, pods: Iterable[Pod], exclude: frozenset[str] = frozenset()
    ) -> Decision:
        """Choose a pod; 503 when none is usable, 429 when every usable one is saturated
        or at capacity."""
        candidates = [pod for pod in pods if pod.address not in exclude]
        if not candidates:
            raise APIError(503, "no LLM pod is available", code="no_pod_available")
        candidates, healthy, saturated = self._filtered(request, candidates)
        totals = [0.0] * len(candidates)
        for scorer, weight in self.config.scorers:
            scores = _timed(scorer.type, scorer.score, request, candidates, self.index)
            for i, score in enumerate(scores):
                totals[i] += weight * min(1.0, max(0.0, score))
        picker = self.config.picker
        pod = _timed(picker.type, picker.pick, candidates, totals)
        matched, total = request.matched_blocks(pod, self.index)
        metrics.PREFIX_HIT_RATIO.observe(matched / total if total else 0.0)
        matched_tokens = matched * pod.page_size
        # Judged before this decision enters the index: what each pod held when it was made.
        held = {p.address: self._held(request, p) for p in healthy if p.address != pod.address}
        held[pod.address] = matched_tokens
        scores = {other.address: score for other, score in zip(candidates, totals, strict=True)}
        basis = regret.basis(pod.address, held, scores, saturated)
        hashes = request.block_hashes(pod.page_size)
        self.index.record_decision(pod.address, hashes)
        # Counted now, before any await: the next request routed sees this one.
        ticket = pod.inflight.open(len(request.input_ids) - matched_tokens)
        return Decision(pod, matched_tokens, hashes, ticket, basis)

    def _filtered(
        self, request: RoutingRequest, candidates: list[Pod]
    ) -> tuple[list[Pod], list[Pod], set[str]]:
        """(the pods that pass the filters and have room, the healthy pods: those no filter
        answering 503 dropped, the addresses of the healthy pods dropped for their load: by
        a filter answering 429 or for want of room). Raises when no pod is left."""
        healthy = candidates
        saturated: set[str] = set()
        for plugin in self.config.filters:
            passed = _timed(plugin.type, plugin.filter, request, candidates, self.index)
            dropped = {pod.address for pod in candidates} - {pod.address for pod in passed}
            if plugin.empty_status == 429:
                saturated |= dropped
            else:
                healthy = [pod for pod in healthy if pod.address not in dropped]
            candidates = passed
            if not candidates:
                if plugin.empty_status == 429:
                    raise APIError(
                        429,
                        "every LLM pod is saturated; retry later",
                        code="overloaded",
                        retry_after=self.retry_after_s,
                    )
                raise APIError(
                    503, f"no LLM pod passes the {plugin.type!r} filter", code="no_pod_available"
                )
        roomy = self.capacity.with_room(candidates)
        saturated |= {pod.address for pod in candidates} - {pod.address for pod in roomy}
        return roomy, healthy, saturated

    def _held(self, request: RoutingRequest, pod: Pod) -> int:
        """The leading prompt tokens `pod` holds and would resume, by the index."""
        return request.matched_blocks(pod, self.index)[0] * pod.page_size


def _timed(name: str, call, *args):
    start = time.perf_counter()
    try:
        return call(*args)
    finally:
        metrics.ROUTING_PLUGIN_SECONDS.labels(name).observe(time.perf_counter() - start)
