"""Routing regret (gateway/routing/regret.py): the real router over a real KV index judges
each choice against the deepest prefix a healthy pod held, and the reason it passed that
pod over; `record` counts into the gateway's real Prometheus registry."""

import numpy as np
import pytest
from prometheus_client import REGISTRY

from gateway.routing import regret
from gateway.routing.config import load_router_config
from gateway.routing.kv_index import KVIndex
from gateway.routing.plugins.base import RoutingRequest
from gateway.routing.pods import Pod, PodLoad
from gateway.routing.router import Router
from iris import metrics as names
from iris.multimodal import block_hashes

FINGERPRINT = bytes(range(32))
IDS = np.arange(32, dtype=np.int64)  # 8 pages of 4; a holder resumes 7 (28 tokens)
HELD = 28


def two_pods(holder_load: PodLoad | None = None, holder_healthy: bool = True) -> list[Pod]:
    """p0 holds nothing; p1 holds the whole prompt (by its KV snapshot)."""
    return [
        Pod("p0", page_size=4, healthy=True, load=PodLoad()),
        Pod("p1", page_size=4, healthy=holder_healthy, load=holder_load or PodLoad()),
    ]


def route(policy: str, pods: list[Pod], exclude: frozenset[str] = frozenset()):
    index = KVIndex()
    index.load_snapshot("p1", 0, block_hashes(FINGERPRINT, IDS, 4))
    router = Router(load_router_config(policy), index)
    return router.route(RoutingRequest(IDS, FINGERPRINT), pods, exclude)


def test_the_holder_chosen_has_no_regret_unless_it_lost_its_cache():
    decision = route("prefix-aware", two_pods())
    assert decision.pod.address == "p1"
    assert decision.regret_basis == regret.Basis(HELD, HELD)
    assert regret.judge(decision.regret_basis, HELD) == regret.Regret(0, None)
    # The pod held less than its index said: the tokens it computed were nowhere else.
    assert regret.judge(decision.regret_basis, 0) == regret.Regret(HELD, regret.STALE_INDEX)


def test_a_loaded_holder_passed_over_is_regret_by_load():
    pods = two_pods()
    pods[1].inflight.open(10_000)  # a long prompt waits for its prefill there
    decision = route("prefix-aware", pods)
    assert decision.pod.address == "p0"  # the emptier pod
    assert decision.regret_basis == regret.Basis(HELD, 0, regret.LOAD)
    assert regret.judge(decision.regret_basis, 0) == regret.Regret(HELD, regret.LOAD)


def test_a_saturated_holder_passed_over_is_regret_by_saturation():
    decision = route("prefix-aware", two_pods(PodLoad(waiting=1000)))
    assert decision.pod.address == "p0"
    assert regret.judge(decision.regret_basis, 0) == regret.Regret(HELD, regret.SATURATION)


def test_a_policy_that_sees_no_difference_is_regret_by_tie():
    decision = route("round-robin", two_pods())  # its first turn is p0
    assert decision.pod.address == "p0"
    assert regret.judge(decision.regret_basis, 0) == regret.Regret(HELD, regret.TIE)


def test_a_pod_that_is_no_alternative_counts_for_nothing():
    unhealthy = route("prefix-aware", two_pods(holder_healthy=False))
    assert unhealthy.pod.address == "p0" and unhealthy.regret_basis == regret.Basis(0, 0)
    refused = route("prefix-aware", two_pods(), exclude=frozenset({"p1"}))
    assert refused.pod.address == "p0" and refused.regret_basis == regret.Basis(0, 0)


def test_the_pod_holding_more_than_the_index_knew_loses_nothing():
    passed_over = regret.Basis(deepest=64, predicted=16, passed_over=regret.LOAD)
    assert regret.judge(passed_over, 64) == regret.Regret(0, None)
    # Short of the deepest by the choice, and short of its own prediction too: one
    # reason per request, the choice's.
    assert regret.judge(passed_over, 0) == regret.Regret(64, regret.LOAD)


@pytest.mark.parametrize(
    ("held", "scores", "saturated", "reason"),
    [
        ({"a": 0, "b": 32, "c": 32}, {"a": 1.0, "b": 0.5, "c": 1.0}, set(), regret.TIE),
        ({"a": 0, "b": 32, "c": 32}, {"a": 1.0, "c": 0.5}, {"b"}, regret.LOAD),
        ({"a": 0, "b": 32, "c": 32}, {"a": 1.0}, {"b", "c"}, regret.SATURATION),
        ({"a": 16, "b": 32}, {"a": 1.0, "b": 0.9}, set(), regret.LOAD),
    ],
)
def test_the_reason_is_the_best_chance_a_deepest_holder_had(held, scores, saturated, reason):
    assert regret.basis("a", held, scores, saturated).passed_over == reason


def sample(name: str, labels: dict | None = None) -> float:
    return REGISTRY.get_sample_value(name, labels or {}) or 0.0


def test_record_counts_tokens_by_reason_and_every_prompt_token():
    counter = names.GATEWAY_ROUTING_REGRET_TOKENS
    histogram = names.GATEWAY_ROUTING_REQUEST_REGRET_TOKENS
    # Every reason is exported from the start, at zero: the share is never absent.
    for reason in regret.REASONS:
        assert REGISTRY.get_sample_value(counter, {names.LABEL_REASON: reason}) is not None
    load = {names.LABEL_REASON: regret.LOAD}
    none = {names.LABEL_REASON: regret.NONE}
    before = {
        "load": sample(counter, load),
        "prompt": sample(names.GATEWAY_ROUTING_PROMPT_TOKENS),
        "load_count": sample(f"{histogram}_count", load),
        "none_count": sample(f"{histogram}_count", none),
    }
    regret.record(regret.Basis(48, 0, regret.LOAD), actual=16, prompt_tokens=100)
    regret.record(regret.Basis(48, 48), actual=48, prompt_tokens=60)
    assert sample(counter, load) - before["load"] == 32
    assert sample(names.GATEWAY_ROUTING_PROMPT_TOKENS) - before["prompt"] == 160
    assert sample(f"{histogram}_count", load) - before["load_count"] == 1
    assert sample(f"{histogram}_count", none) - before["none_count"] == 1
