"""The KV index: snapshot + events in sequence, gap detection, decisions fallback."""

from gateway.routing.kv_index import KVEventRecord, KVIndex, Source

A, B, C, D = (bytes([i]) * 16 for i in range(1, 5))


def stored(seq, *blocks):
    return KVEventRecord(seq, True, list(blocks))


def removed(seq, *blocks):
    return KVEventRecord(seq, False, list(blocks))


def test_prefix_match_stops_at_the_first_missing_block():
    index = KVIndex()
    index.load_snapshot("p", 0, [A, B, D])
    assert index.matched_blocks("p", [A, B, C, D]) == 2
    assert index.matched_blocks("p", [C, A]) == 0
    assert index.matched_blocks("unknown", [A]) == 0


def test_events_in_sequence_store_and_remove_blocks():
    index = KVIndex()
    index.load_snapshot("p", 10, [A])
    assert index.apply("p", [stored(11, B, C), removed(12, A)])
    assert index.blocks("p") == {B, C}
    assert index.seq("p") == 12
    # Old or repeated events are skipped, not re-applied.
    assert index.apply("p", [stored(12, A), stored(5, D)])
    assert index.blocks("p") == {B, C}


def test_a_gap_stops_applying_and_a_snapshot_resyncs():
    index = KVIndex()
    index.load_snapshot("p", 0, [])
    assert not index.apply("p", [stored(1, A), stored(3, C)])
    assert index.blocks("p") == {A}  # applied up to the gap, nothing after
    assert index.seq("p") == 1
    index.load_snapshot("p", 3, [A, B, C])
    assert index.apply("p", [stored(4, D)])
    assert index.blocks("p") == {A, B, C, D}


def test_pods_without_events_learn_from_decisions_only():
    index = KVIndex(max_decision_blocks=3)
    assert index.source("p") is Source.DECISIONS
    assert not index.apply("p", [stored(1, A)])  # not synced: the caller must snapshot
    index.record_decision("p", [A, B])
    index.record_decision("p", [C, D])
    assert index.blocks("p") == {B, C, D}  # LRU bound: the oldest went first
    index.load_snapshot("p", 0, [A])
    index.record_decision("p", [B])  # precise pods ignore decisions
    assert index.blocks("p") == {A}
    index.fall_back("p")
    index.record_decision("p", [B])
    assert index.blocks("p") == {A, B}
    index.forget("p")
    assert index.matched_blocks("p", [A]) == 0


def test_a_hybrid_pod_is_predicted_only_where_it_holds_a_snapshot():
    """Snapshot events (SNAPSHOT_STORED) mark the blocks a hybrid pod can resume after; a
    removal takes the snapshot with it; routing predicts the deepest such multiple of k."""
    import numpy as np

    from gateway.routing.plugins.base import RoutingRequest
    from gateway.routing.pods import Pod
    from iris.multimodal import AttentionLayer, LayerKind

    layers = (
        AttentionLayer(LayerKind.LINEAR, 0, 2),
        AttentionLayer(LayerKind.FULL),
    )
    pod = Pod("p", page_size=4, layers=layers)
    request = RoutingRequest(np.arange(4 * 6 + 1, dtype=np.int64), b"f" * 32)
    hashes = request.block_hashes(4)
    index = KVIndex()
    index.load_snapshot("p", 0, hashes[:6], [hashes[1]])
    assert request.matched_blocks(pod, index) == (2, 6)  # held 6, snapshot only after 2
    assert index.apply("p", [KVEventRecord(1, True, [hashes[5]], snapshot=True)])
    assert request.matched_blocks(pod, index) == (6, 6)
    assert index.apply("p", [removed(2, hashes[5])])
    assert request.matched_blocks(pod, index) == (2, 6)  # the snapshot left with its block
    index.load_snapshot("p", 3, hashes[:6])  # none held: a resync drops them all
    assert request.matched_blocks(pod, index) == (0, 6)
