"""Scorer `estimated-ttft`: each pod's estimated time to this request's first token, seconds.

Where the prompt's leading blocks are for a pod decides what its first token costs there
(`RoutingRequest.cached_blocks`, by the pod's own resume rule over the KV index):

    ttft = queue                 (backlog + decode_tokens x streams) / prefill rate
         + host load             tokens held in host memory only x KV bytes per token
                                   / host-to-device rate
         + store fetch           tokens the shared store holds past what the pod holds
                                   x KV bytes per token / store fetch rate
         + prefill               the prompt's tokens past all of those / prefill rate
         + vision                image tokens past them x encode seconds per image token

Tokens on the pod's device cost nothing. The backlog and streams are counted as
`estimated-wait` counts them (this gateway's placements, plus what the pod's last GetLoad
showed beyond them). The rates are the pod's own, measured and reported in GetLoad; a rate
a pod has not measured yet is the mean of those its peers report, else the default given
here. The encode time per image token is this gateway's, measured over its Encode calls
(0 until one ran): it counts every image token the pod would compute, though the embedding
cache may already hold some of them, so it leans towards pods that hold the images' KV.

Score: the fastest candidate's estimate over this pod's (1 for the best, in (0, 1]),
with a millisecond added to both so that near-zero estimates do not amplify noise.
"""

from __future__ import annotations

from dataclasses import dataclass

from gateway.routing.plugins.base import Scorer, register
from gateway.routing.pods import Pod

SLACK_S = 1e-3


@dataclass(frozen=True)
class Breakdown:
    """One pod's estimate, by part (seconds)."""

    queue: float
    host_load: float
    store_fetch: float
    prefill: float
    vision: float

    @property
    def total(self) -> float:
        return self.queue + self.host_load + self.store_fetch + self.prefill + self.vision


@register
class EstimatedTTFT(Scorer):
    type = "estimated-ttft"

    def __init__(
        self,
        decode_tokens: float = 1.0,
        prefill_tokens_per_s: float = 2_000.0,
        host_load_bytes_per_s: float = 2e9,
        store_fetch_bytes_per_s: float = 2e8,
    ) -> None:
        for name, value in (
            ("decode_tokens", decode_tokens),
            ("prefill_tokens_per_s", prefill_tokens_per_s),
            ("host_load_bytes_per_s", host_load_bytes_per_s),
            ("store_fetch_bytes_per_s", store_fetch_bytes_per_s),
        ):
            if value < 0 or (name != "decode_tokens" and value == 0):
                raise ValueError(f"{name} must be > 0 (decode_tokens >= 0), got {value}")
        self.decode_tokens = float(decode_tokens)
        self.defaults = {
            "prefill_tokens_per_s": float(prefill_tokens_per_s),
            "host_load_bytes_per_s": float(host_load_bytes_per_s),
            "store_fetch_bytes_per_s": float(store_fetch_bytes_per_s),
        }

    def estimates(self, request, pods: list[Pod], index) -> list[Breakdown]:
        """Each pod's estimated seconds to the request's first token, by part."""
        rates = {name: self._rate(name, pods) for name in self.defaults}
        prompt = len(request.input_ids)
        out = []
        for pod in pods:
            cached = request.cached_blocks(pod, index)
            page = pod.page_size
            prefill_rate = rates["prefill_tokens_per_s"][pod.address]
            token_bytes = pod.load.rates.kv_bytes_per_token
            seen = pod.inflight.view()
            backlog = seen.prefill_tokens + seen.others_prefill_tokens
            streams = seen.decoding + seen.others_running
            from_host = (cached.held - cached.device) * page
            from_store = max(0, cached.store - cached.held) * page
            covered = cached.resumed * page
            out.append(
                Breakdown(
                    queue=(backlog + self.decode_tokens * streams) / prefill_rate,
                    host_load=from_host * token_bytes / rates["host_load_bytes_per_s"][pod.address],
                    store_fetch=from_store
                    * token_bytes
                    / rates["store_fetch_bytes_per_s"][pod.address],
                    prefill=max(0, prompt - covered) / prefill_rate,
                    vision=_image_tokens_after(request.image_spans, covered)
                    * request.encode_seconds_per_token,
                )
            )
        return out

    def score(self, request, pods, index):
        totals = [estimate.total for estimate in self.estimates(request, pods, index)]
        best = min(totals, default=0.0)
        return [(best + SLACK_S) / (total + SLACK_S) for total in totals]

    def _rate(self, name: str, pods: list[Pod]) -> dict[str, float]:
        """Each pod's measured rate `name`; one not measured yet: its peers' mean, else the
        default."""
        measured = {pod.address: getattr(pod.load.rates, name) for pod in pods}
        known = [value for value in measured.values() if value > 0]
        fallback = sum(known) / len(known) if known else self.defaults[name]
        return {address: value if value > 0 else fallback for address, value in measured.items()}


def _image_tokens_after(spans: list[tuple[int, int]], covered: int) -> int:
    """Image tokens at or after position `covered` (those the pod would compute)."""
    return sum(end - max(start, covered) for start, end in spans if end > covered)
