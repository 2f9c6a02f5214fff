"""Scorers `prefix`, `kv-utilisation`, `queue-depth`: values in [0, 1]."""

import numpy as np

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
    assert create_plugin("prefix").score(request, pods, index) == [0.5, 1.0, 0.0, 0.0]


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
