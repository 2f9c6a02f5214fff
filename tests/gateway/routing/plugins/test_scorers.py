"""Scorers `prefix`, `kv-utilisation`, `queue-depth` (values in [0, 1]) and `estimated-wait`."""

import numpy as np
import pytest

from gateway.routing.kv_index import KVIndex
from gateway.routing.plugins import create_plugin
from gateway.routing.plugins.base import RoutingRequest
from gateway.routing.pods import Pod, PodLoad
from iris.multimodal import block_hashes

FINGERPRINT = bytes(32)


def test_prefix_scores_the_share_of_blocks_held():
    ids = np.arange(16, dtype=np.int64)
    hashes = block_hashes(FINGERPRINT, ids, 4)
    index = KVIndex()
    index.load_snapshot("half", 0, hashes[:2])
    index.load_snapshot("all", 0, hashes)
    index.load_snapshot("tail", 0, hashes[1:])  # no first block: no prefix
    pods = [Pod(name, page_size=4) for name in ("half", "all", "tail", "none")]
    request = RoutingRequest(ids, FINGERPRINT)
    # Of 4 full blocks the pod may reuse 3 (it computes the last token again).
    scores = create_plugin("prefix").score(request, pods, index)
    assert scores == pytest.approx([2 / 3, 1.0, 0.0, 0.0])


def test_prefix_of_a_prompt_shorter_than_a_block_is_zero():
    request = RoutingRequest(np.arange(3, dtype=np.int64), FINGERPRINT)
    assert create_plugin("prefix").score(request, [Pod("a", page_size=4)], KVIndex()) == [0.0]


def test_kv_utilisation_prefers_free_cache():
    pods = [Pod("a", load=PodLoad(kv_utilisation=0.25)), Pod("b", load=PodLoad())]
    assert create_plugin("kv-utilisation").score(None, pods, KVIndex()) == [0.75, 1.0]


def test_queue_depth_is_min_max_scaled():
    pods = [Pod(str(i), load=PodLoad(waiting=w, running=1)) for i, w in enumerate([0, 5, 10])]
    assert create_plugin("queue-depth").score(None, pods, KVIndex()) == [1.0, 0.5, 0.0]
    same = [Pod("a", load=PodLoad(waiting=3)), Pod("b", load=PodLoad(waiting=3))]
    assert create_plugin("queue-depth").score(None, same, KVIndex()) == [1.0, 1.0]


def _prompt(n):
    return RoutingRequest(np.arange(n, dtype=np.int64), FINGERPRINT)


def test_estimated_wait_prefers_the_held_prefix_between_equally_idle_pods():
    ids = np.arange(64, dtype=np.int64)
    index = KVIndex()
    index.load_snapshot("b", 0, block_hashes(FINGERPRINT, ids[:48], 4))
    pods = [Pod("a", page_size=4, healthy=True), Pod("b", page_size=4, healthy=True)]
    scorer = create_plugin("estimated-wait")
    request = RoutingRequest(ids, FINGERPRINT)
    assert scorer.costs(request, pods, index) == [64.0, 16.0]
    assert scorer.score(request, pods, index) == [17 / 65, 1.0]


def test_estimated_wait_adds_other_gateways_load_to_its_own_placements():
    scorer = create_plugin("estimated-wait", {"decode_tokens": 10})
    polled = Pod("polled", page_size=4, healthy=True)
    # Another gateway's work: the pod reports 3 running and 200 tokens, none of them ours.
    polled.inflight.observe(3, 200, polled.inflight.view())
    placed = Pod("placed", page_size=4, healthy=True)
    placed.inflight.open(50)
    streaming = placed.inflight.open(7)
    streaming.first_token()
    # polled: 200 backlog + 8 uncached + 3 streams x 10; placed: 50 + 8 + 1 stream x 10.
    assert scorer.costs(_prompt(8), [polled, placed], KVIndex()) == [238.0, 68.0]


def test_estimated_wait_moves_off_a_hot_pod_once_its_queue_outweighs_the_prefix():
    ids = np.arange(256, dtype=np.int64)
    index = KVIndex()
    index.load_snapshot("hot", 0, block_hashes(FINGERPRINT, ids, 4))
    hot, idle = Pod("hot", page_size=4, healthy=True), Pod("idle", page_size=4, healthy=True)
    scorer = create_plugin("estimated-wait", {"decode_tokens": 64})
    request = RoutingRequest(ids, FINGERPRINT)
    for _ in range(3):  # 3 streams: 192 tokens of delay < 256 saved
        hot.inflight.open(0).first_token()
    assert scorer.score(request, [hot, idle], index)[0] == 1.0
    hot.inflight.open(0).first_token()  # a fourth: 256 + 0 vs 256 -> tie
    hot.inflight.open(0).first_token()  # a fifth: the idle pod is now cheaper
    assert scorer.score(request, [hot, idle], index)[1] == 1.0


def test_estimated_wait_refuses_a_negative_decode_weight():
    with pytest.raises(ValueError, match="decode_tokens"):
        create_plugin("estimated-wait", {"decode_tokens": -1})


def test_a_held_prefix_ending_inside_an_uncut_span_counts_back_to_the_span():
    """Gemma 3's images: the gateway predicts what the pod's block manager resumes (the same
    PrefixResumeRule with the same spans), so a held prefix that ends inside an image span
    counts only the blocks before the span."""
    from iris.multimodal import PrefixResumeRule

    ids = np.arange(40, dtype=np.int64)
    hashes = block_hashes(FINGERPRINT, ids, 4)
    index = KVIndex()
    index.load_snapshot("inside", 0, hashes[:5])  # 20 tokens: ends inside [10, 26)
    index.load_snapshot("before", 0, hashes[:2])  # 8 tokens: ends before the span
    pods = [Pod("inside", page_size=4), Pod("before", page_size=4)]
    request = RoutingRequest(ids, FINGERPRINT, uncut_spans=[(10, 26)])
    matched = [request.matched_blocks(pod, index)[0] for pod in pods]
    assert matched == [2, 2]
    pod_rule = PrefixResumeRule(4)
    assert pod_rule.resumable_blocks(40, 5, [(10, 26)]) == matched[0]
    assert RoutingRequest(ids, FINGERPRINT).matched_blocks(pods[0], index)[0] == 5
