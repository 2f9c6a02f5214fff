"""How right routing was: the prefix it predicted on the chosen pod against what the pod held.

Routing predicts, for the pod it picks, how many leading prompt tokens that pod holds in its
prefix cache: from its index (the pods' KV events, or its own decisions without them) and
its in-flight decisions, exactly the figure it routed by (`Decision.matched_tokens`). The
pod answers with `cached_tokens` when it accepts the request (its prefix-cache hit at
admission). The two differ when the index is stale: events not yet applied, a pod that lost
its cache unannounced, another gateway's requests the index has not seen.

    error = actual - predicted            (tokens; < 0: over-prediction, a routing miss)
    precision = share of requests with predicted > 0 whose |error| <= one page

Over- and under-predictions count any difference; precision forgives less than a page
(the pod's own rounding to whole pages). The recording rule
`iris:gateway_routing_precision:ratio_rate5m` divides the two precision counters.
"""

from __future__ import annotations

from dataclasses import dataclass

from gateway import metrics


@dataclass(frozen=True)
class Prediction:
    """One request's outcome: what routing predicted, what the pod held, the pod's page."""

    predicted: int
    actual: int
    page_size: int

    @property
    def error(self) -> int:
        return self.actual - self.predicted

    @property
    def over(self) -> bool:
        return self.actual < self.predicted

    @property
    def under(self) -> bool:
        return self.actual > self.predicted

    @property
    def counts_for_precision(self) -> bool:
        return self.predicted > 0

    @property
    def within_page(self) -> bool:
        return abs(self.error) <= self.page_size


def record(predicted: int, actual: int, page_size: int) -> Prediction:
    """Count one accepted request's prediction against the pod's answer."""
    outcome = Prediction(int(predicted), int(actual), int(page_size))
    metrics.ROUTING_PREFIX_ERROR_TOKENS.observe(outcome.error)
    if outcome.over:
        metrics.ROUTING_OVER_PREDICTIONS.inc()
    elif outcome.under:
        metrics.ROUTING_UNDER_PREDICTIONS.inc()
    if outcome.counts_for_precision:
        metrics.ROUTING_PREDICTED.inc()
        if outcome.within_page:
            metrics.ROUTING_PREDICTED_WITHIN_PAGE.inc()
    return outcome
