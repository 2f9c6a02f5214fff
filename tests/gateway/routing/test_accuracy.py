"""Routing accuracy (gateway/routing/accuracy.py): one request's predicted prefix against
the pod's cached_tokens, counted into the gateway's real Prometheus registry."""

import pytest
from prometheus_client import REGISTRY

from gateway.routing.accuracy import record
from iris import metrics as names

COUNTERS = {
    "over": names.GATEWAY_ROUTING_OVER_PREDICTIONS,
    "under": names.GATEWAY_ROUTING_UNDER_PREDICTIONS,
    "predicted": names.GATEWAY_ROUTING_PREDICTED,
    "within": names.GATEWAY_ROUTING_PREDICTED_WITHIN_PAGE,
}


def snapshot() -> dict[str, float]:
    values = {key: REGISTRY.get_sample_value(name) or 0.0 for key, name in COUNTERS.items()}
    hist = names.GATEWAY_ROUTING_PREFIX_ERROR_TOKENS
    values["count"] = REGISTRY.get_sample_value(f"{hist}_count") or 0.0
    values["le0"] = REGISTRY.get_sample_value(f"{hist}_bucket", {"le": "0.0"}) or 0.0
    values["le-1"] = REGISTRY.get_sample_value(f"{hist}_bucket", {"le": "-1.0"}) or 0.0
    return values


def counted(predicted: int, actual: int, page: int = 16) -> dict[str, float]:
    before = snapshot()
    record(predicted, actual, page)
    after = snapshot()
    return {key: after[key] - before[key] for key in after}


@pytest.mark.parametrize(
    ("predicted", "actual", "expected"),
    [
        # exact: precise, neither over nor under
        (64, 64, {"predicted": 1, "within": 1}),
        # the pod lost two pages: an over-prediction, outside precision
        (64, 32, {"over": 1, "predicted": 1}),
        # one page short: still an over-prediction, but within a page for precision
        (64, 48, {"over": 1, "predicted": 1, "within": 1}),
        # the pod held more than routing knew (another gateway's request, say)
        (32, 96, {"under": 1, "predicted": 1}),
        # nothing predicted: no precision sample, but the surprise still counts
        (0, 48, {"under": 1}),
        (0, 0, {}),
    ],
)
def test_outcome_counters(predicted, actual, expected):
    delta = counted(predicted, actual)
    for key in COUNTERS:
        assert delta[key] == expected.get(key, 0), key
    assert delta["count"] == 1


def test_histogram_puts_misses_below_zero_and_hits_at_zero():
    miss = counted(160, 0)
    assert miss["le-1"] == 1 and miss["le0"] == 1
    hit = counted(160, 160)
    assert hit["le-1"] == 0 and hit["le0"] == 1
    surprise = counted(0, 160)
    assert surprise["le0"] == 0


def test_prediction_reports_its_error_and_kind():
    outcome = record(64, 16, 16)
    assert outcome.error == -48 and outcome.over and not outcome.under
    assert outcome.counts_for_precision and not outcome.within_page
