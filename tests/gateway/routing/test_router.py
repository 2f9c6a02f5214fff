"""The chain from YAML, the router's statuses, and per-plugin timing."""

import numpy as np
import pytest
from prometheus_client import REGISTRY

from gateway.errors import APIError
from gateway.routing.config import load_router_config, parse_router_config
from gateway.routing.kv_index import KVIndex
from gateway.routing.plugins.base import RoutingRequest
from gateway.routing.pods import Pod, PodLoad
from gateway.routing.router import Router
from iris import metrics as names
from iris.multimodal import block_hashes

FINGERPRINT = bytes(range(32))


def pods(*loads):
    return [Pod(f"p{i}", page_size=4, healthy=True, load=load) for i, load in enumerate(loads)]


def test_builtin_policies_and_files_load(tmp_path):
    config = load_router_config("prefix-aware")
    assert [f.type for f in config.filters] == ["healthy", "not-saturated"]
    assert [(s.type, w) for s, w in config.scorers] == [("estimated-ttft", 1.0)]
    path = tmp_path / "router.yaml"
    path.write_text("filters: [{type: healthy}]\nscorers: [{type: prefix, weight: 2}]\n")
    assert load_router_config(str(path)).picker.type == "max-score"


@pytest.mark.parametrize(
    ("document", "fragment"),
    [
        ({"filters": [{"type": "nope"}]}, "unknown routing plugin type 'nope'"),
        ({"scorers": [{"type": "healthy"}]}, "is a filter, not a scorer"),
        (
            {"scorers": [{"type": "prefix", "weight": -1}]},
            r"scorers\[0\]\.weight: -1: Input should be greater than or equal to 0",
        ),
        ({"scorers": [{"type": "prefix", "weight": True}]}, r"scorers\[0\]\.weight: True"),
        ({"picker": {"type": "prefix"}}, "not a picker"),
        ({"filter": []}, r"router\.filter: \[\]: Extra inputs are not permitted"),
        ({"filters": [{"params": {}}]}, r"filters\[0\]\.type: Field required"),
        ([], "valid dictionary"),
    ],
)
def test_bad_configs_name_the_problem(document, fragment):
    with pytest.raises(ValueError, match=fragment):
        parse_router_config(document)


def test_unknown_policy_name_lists_the_builtins():
    with pytest.raises(ValueError, match="prefix-aware"):
        load_router_config("fastest")


def test_prefix_wins_over_load_and_decisions_are_recorded():
    ids = np.arange(32, dtype=np.int64)
    index = KVIndex()
    index.load_snapshot("p1", 0, block_hashes(FINGERPRINT, ids, 4))
    router = Router(load_router_config("prefix-aware"), index)
    candidates = pods(PodLoad(), PodLoad(kv_utilisation=0.5, waiting=3))
    decision = router.route(RoutingRequest(ids, FINGERPRINT), candidates)
    assert decision.pod.address == "p1"
    assert decision.matched_tokens == 28  # the pod computes the last page again
    # p0 is on decisions: the next prompt with this prefix finds it there too.
    other = router.route(RoutingRequest(ids, FINGERPRINT), candidates, frozenset({"p1"}))
    assert other.pod.address == "p0" and other.matched_tokens == 0
    assert index.matched_blocks("p0", block_hashes(FINGERPRINT, ids, 4)) == 8


def test_no_usable_pod_is_503_and_all_saturated_is_429_with_retry_after():
    router = Router(load_router_config("prefix-aware"), KVIndex(), retry_after_s=2)
    request = RoutingRequest(np.arange(8, dtype=np.int64), FINGERPRINT)
    with pytest.raises(APIError) as caught:
        router.route(request, [Pod("a", page_size=4, healthy=False)])
    assert caught.value.status == 503
    with pytest.raises(APIError) as caught:
        router.route(request, pods(PodLoad(waiting=1000), PodLoad(kv_utilisation=0.99)))
    assert caught.value.status == 429 and caught.value.retry_after == 2
    with pytest.raises(APIError) as caught:
        router.route(request, [])
    assert caught.value.status == 503


def test_every_plugin_call_is_timed():
    def count(plugin):
        value = REGISTRY.get_sample_value(
            f"{names.GATEWAY_ROUTING_PLUGIN_SECONDS}_count", {names.LABEL_PLUGIN: plugin}
        )
        return value or 0.0

    plugins = ["healthy", "not-saturated", "estimated-ttft", "max-score"]
    before = {name: count(name) for name in plugins}
    router = Router(load_router_config("prefix-aware"), KVIndex())
    router.route(RoutingRequest(np.arange(8, dtype=np.int64), FINGERPRINT), pods(PodLoad()))
    assert all(count(name) == before[name] + 1 for name in plugins)


def test_round_robin_policy_alternates():
    router = Router(load_router_config("round-robin"), KVIndex())
    request = RoutingRequest(np.arange(8, dtype=np.int64), FINGERPRINT)
    candidates = pods(PodLoad(), PodLoad())
    picks = [router.route(request, candidates).pod.address for _ in range(4)]
    assert picks == ["p0", "p1", "p0", "p1"]


def test_a_decision_opens_a_ticket_on_the_chosen_pod():
    router = Router(load_router_config("prefix-aware"), KVIndex())
    candidates = pods(PodLoad())
    decision = router.route(RoutingRequest(np.arange(10, dtype=np.int64), FINGERPRINT), candidates)
    assert candidates[0].inflight.view().prefill_tokens == 10
    decision.ticket.close()
    assert candidates[0].inflight.view().requests == 0


def test_a_burst_sharing_a_system_prompt_spreads_over_the_pods():
    """Every request starts with the same long system prompt. Scoring prefix share and load
    apart sent them all to the pod that held the prompt; weighed in one unit (with the
    placements counted as they are made, before any pod reports load) they spread."""
    system = np.arange(400, dtype=np.int64)
    index = KVIndex()
    index.load_snapshot("p0", 0, block_hashes(FINGERPRINT, system, 4))
    router = Router(load_router_config("prefix-aware"), index)
    candidates = pods(PodLoad(), PodLoad(), PodLoad(), PodLoad())
    chosen = []
    for user in range(16):
        question = np.arange(1000 + 40 * user, 1040 + 40 * user, dtype=np.int64)
        request = RoutingRequest(np.concatenate([system, question]), FINGERPRINT)
        chosen.append(router.route(request, candidates).pod.address)
    assert chosen[0] == "p0"  # the held prefix wins while the pods are equally idle
    assert set(chosen) == {"p0", "p1", "p2", "p3"}
    # The holder still takes more than its share: its prefix saves real work.
    assert chosen.count("p0") > len(chosen) / 4
