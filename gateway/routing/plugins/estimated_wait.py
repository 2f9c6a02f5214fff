"""Scorer `estimated-wait`: prefix reuse and load weighed in one unit, prompt tokens.

A request's first token waits for the prefill the pod must do before and for it:

    cost = prefill backlog + this prompt's tokens the pod does not hold
           + decode_tokens x streams the pod is decoding

The backlog and streams are this gateway's own placements, counted as they are made, plus
what the pod's last GetLoad answer showed beyond them (other gateways' requests; the answer
itself is up to a poll interval old, see gateway/routing/inflight.py).

`decode_tokens` is how much prefill one running stream is worth in delay. With chunked
prefill a decoding stream takes one token of each step's token budget, so by default it
counts as one: the prefill queued ahead is what delays a first token, and a long cached
prefix is worth keeping until its pod's queue outweighs it. Pods whose steps slow down with
many streams can raise it. (On the 2-core CPU machine, where every pod shares the cores,
decode_tokens=64 spread requests wider, lost prefix hits and raised TTFT in
bench/workload.py.) Streams are this gateway's decoding requests plus the others' running
ones; the others' waiting requests are in the backlog already, as their prefill tokens.

Score: the cheapest candidate's cost over this pod's (1 for the best, in (0, 1]).
"""

from __future__ import annotations

from gateway.routing.plugins.base import Scorer, register


@register
class EstimatedWait(Scorer):
    type = "estimated-wait"

    def __init__(self, decode_tokens: float = 1.0) -> None:
        if decode_tokens < 0:
            raise ValueError(f"decode_tokens must be >= 0, got {decode_tokens}")
        self.decode_tokens = float(decode_tokens)

    def costs(self, request, pods, index) -> list[float]:
        """Each pod's estimated prefill tokens ahead of this request's first token."""
        prompt_tokens = len(request.input_ids)
        costs = []
        for pod in pods:
            matched, _ = request.matched_blocks(pod, index)
            uncached = max(0, prompt_tokens - matched * pod.page_size)
            seen = pod.inflight.view()
            backlog = seen.prefill_tokens + seen.others_prefill_tokens
            streams = seen.decoding + seen.others_running
            costs.append(backlog + uncached + self.decode_tokens * streams)
        return costs

    def score(self, request, pods, index):
        costs = self.costs(request, pods, index)
        best = min(costs, default=0.0)
        return [(best + 1.0) / (cost + 1.0) for cost in costs]
