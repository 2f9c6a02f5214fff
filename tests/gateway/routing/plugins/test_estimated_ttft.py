"""Scorer `estimated-ttft`: each pod's time to the first token in seconds, from where the
prompt's blocks are (device, host memory, the shared store, nowhere), its queue, and the
rates it measured; and the KV index's tiers it reads."""

import numpy as np
import pytest

from gateway.routing.kv_index import KVEventRecord, KVIndex
from gateway.routing.plugins import create_plugin
from gateway.routing.plugins.base import RoutingRequest
from gateway.routing.pods import Pod, PodLoad, PodRates
from iris.multimodal import block_hashes

FINGERPRINT = bytes(32)
PAGE = 4
IDS = np.arange(64, dtype=np.int64)  # 16 blocks, 15 resumable (the last token is computed)
HASHES = block_hashes(FINGERPRINT, IDS, PAGE)
RATES = PodRates(prefill_tokens_per_s=100.0, host_load_bytes_per_s=1000.0,
                 store_fetch_bytes_per_s=100.0, kv_bytes_per_token=10, kv_store=True)  # fmt: skip


def _pod(name: str, rates: PodRates = RATES) -> Pod:
    return Pod(name, page_size=PAGE, healthy=True, load=PodLoad(rates=rates))


def _request(**fields) -> RoutingRequest:
    return RoutingRequest(IDS, FINGERPRINT, **fields)


def test_each_tier_is_priced_at_its_own_rate():
    index = KVIndex()
    index.load_snapshot("device", 0, HASHES)
    index.load_snapshot("host", 0, HASHES, host_hashes=HASHES[8:])
    index.load_snapshot("empty", 0, [])
    index.load_snapshot("writer", 0, [])
    index.apply("writer", [KVEventRecord(1, True, HASHES[:12], tier="store")])
    pods = [_pod("device"), _pod("host"), _pod("empty", PodRates(100.0, 1000.0, 100.0, 10))]
    scorer = create_plugin("estimated-ttft")
    device, host, prefill = scorer.estimates(_request(), pods, index)
    # The device holds 15 blocks: only the last 4 tokens are prefilled.
    assert device.total == pytest.approx(4 / 100)
    # 8 blocks on the device, 7 in host memory: 28 tokens x 10 bytes at 1000 bytes/s.
    assert host.host_load == pytest.approx(28 * 10 / 1000) and host.prefill == pytest.approx(0.04)
    # A pod without the store prefills everything; with it, 12 blocks come from the store.
    assert prefill.total == pytest.approx(64 / 100)
    (fetch,) = scorer.estimates(_request(), [_pod("empty")], index)
    assert fetch.store_fetch == pytest.approx(48 * 10 / 100)
    assert fetch.prefill == pytest.approx(16 / 100)
    scores = scorer.score(_request(), pods, index)
    assert scores[0] == 1.0 and scores[0] > scores[1] > scores[2]


def test_a_warm_but_loaded_pod_loses_to_an_idle_one_that_loads_from_host():
    index = KVIndex()
    index.load_snapshot("warm", 0, HASHES)
    index.load_snapshot("idle", 0, HASHES, host_hashes=HASHES)
    warm, idle = _pod("warm"), _pod("idle")
    scorer = create_plugin("estimated-ttft")
    assert scorer.score(_request(), [warm, idle], index)[0] == 1.0
    warm.inflight.open(100)  # a second of prefill queued ahead; loading 60 tokens: 0.6 s
    warm_s, idle_s = 1.0 + 0.04, 0.6 + 0.04
    expected = (idle_s + 1e-3) / (warm_s + 1e-3)
    assert scorer.score(_request(), [warm, idle], index) == pytest.approx([expected, 1.0])


def test_image_tokens_past_the_held_prefix_cost_their_encoding():
    index = KVIndex()
    index.load_snapshot("holder", 0, HASHES)
    pods = [_pod("holder"), _pod("other")]
    scorer = create_plugin("estimated-ttft")
    request = _request(image_spans=[(8, 40)], encode_seconds_per_token=0.01)
    holder, other = scorer.estimates(request, pods, index)
    assert holder.vision == 0.0
    assert other.vision == pytest.approx(32 * 0.01)


def test_a_rate_not_measured_yet_is_the_peers_mean_else_the_default():
    index = KVIndex()
    fresh = _pod("fresh", PodRates())
    measured = _pod("measured", PodRates(prefill_tokens_per_s=50.0))
    scorer = create_plugin("estimated-ttft", {"prefill_tokens_per_s": 1000.0})
    a, b = scorer.estimates(_request(), [fresh, measured], index)
    assert a.prefill == b.prefill == pytest.approx(64 / 50)
    (alone,) = scorer.estimates(_request(), [fresh], index)
    assert alone.prefill == pytest.approx(64 / 1000)


def test_bad_params_are_refused_by_name():
    with pytest.raises(ValueError, match="prefill_tokens_per_s"):
        create_plugin("estimated-ttft", {"prefill_tokens_per_s": 0})
    with pytest.raises(ValueError, match="decode_tokens"):
        create_plugin("estimated-ttft", {"decode_tokens": -1})


def test_the_index_keeps_host_moves_per_pod_and_the_store_fleet_wide():
    index = KVIndex(max_store_blocks=4)
    index.load_snapshot("pod", 0, [])
    events = [
        KVEventRecord(1, True, HASHES[:6]),
        KVEventRecord(2, True, HASHES[3:6], tier="host"),
        KVEventRecord(3, True, HASHES[:6], tier="store"),
    ]
    assert index.apply("pod", events)
    assert index.matched_blocks("pod", HASHES) == 6
    assert index.device_blocks("pod", HASHES) == 3
    assert index.store_blocks(HASHES) == 0  # bounded: the oldest two went
    assert index.store_blocks(HASHES[2:]) == 4
    assert index.apply("pod", [KVEventRecord(4, False, HASHES[3:4], tier="host")])
    assert index.device_blocks("pod", HASHES) == 4
    assert index.apply("pod", [KVEventRecord(5, False, HASHES[4:6])])  # removed altogether
    assert index.host_blocks("pod") == set()
    assert index.matched_blocks("pod", HASHES) == 4


def test_regret_and_prediction_count_what_the_store_holds_for_a_pod_that_reads_it():
    index = KVIndex()
    index.load_snapshot("writer", 0, [])
    index.apply("writer", [KVEventRecord(1, True, HASHES, tier="store")])
    with_store = _pod("reader")
    without = _pod("plain", PodRates(kv_store=False))
    assert _request().matched_blocks(with_store, index) == (15, 15)
    assert _request().matched_blocks(without, index) == (0, 15)
