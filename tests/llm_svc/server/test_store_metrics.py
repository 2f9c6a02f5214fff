"""The shared KV store's figures on the pod's /metrics: the client's counters are read at
scrape time (StoreCollector: the writer thread adds to them after the engine's last step),
every series at 0 on a pod without a store; each lookup's time comes with the engine's
stats snapshots (llm_svc/engine/outputs.py, StoreSnapshot) and is observed once."""

from __future__ import annotations

import itertools
from types import SimpleNamespace

from iris import metrics as names
from llm_svc.engine import EngineConfig, EngineStats, LLMEngine
from llm_svc.engine.kv_store import KVStoreConfig, StoreStats
from llm_svc.engine.outputs import StoreSnapshot
from llm_svc.server.metrics import LLMMetrics
from tests.llm_svc.checkpoints import tiny_checkpoint
from tests.llm_svc.conftest import greedy, run_all
from tests.llm_svc.server.test_tier_metrics import samples, value

STORE_METRICS = [
    names.LLM_KV_STORE_CONFIGURED,
    names.LLM_KV_STORE_UP,
    names.LLM_KV_STORE_HITS,
    names.LLM_KV_STORE_MISSES,
    names.LLM_KV_STORE_BYTES,
    names.LLM_KV_STORE_FETCH_SECONDS,
    names.LLM_KV_STORE_CHECKSUM_FAILURES,
    names.LLM_KV_STORE_DROPPED_WRITES,
    names.LLM_KV_STORE_SKIPPED_WRITES,
    names.LLM_KV_STORE_ERRORS,
]
_names = itertools.count()


def engine_stats(store: StoreSnapshot | None) -> EngineStats:
    return EngineStats(
        running=0, waiting=0, kv_utilisation=0.0, num_pages=8, pending_prefill_tokens=0,
        preemptions=0, prompt_tokens=0, prefix_hit_tokens=0, generation_tokens=0, store=store,
    )  # fmt: skip


def snapshot(*fetch_seconds: float) -> StoreSnapshot:
    return StoreSnapshot(
        hits=0, misses=0, bytes_read=0, bytes_written=0, checksum_failures=0,
        dropped_writes=0, skipped_writes=0, errors=0, available=True,
        fetch_seconds=fetch_seconds,
    )  # fmt: skip


def test_every_store_series_is_exported_at_zero_without_a_store():
    metrics = LLMMetrics()
    metrics.watch_store(None)
    metrics.observe_stats(engine_stats(None))
    found = samples(metrics)
    for name in STORE_METRICS:
        assert any(key[0].startswith(name) for key in found), f"{name} not exported"
    assert value(found, names.LLM_KV_STORE_CONFIGURED) == 0
    assert value(found, names.LLM_KV_STORE_UP) == 0
    for direction in ("read", "written"):
        assert value(found, names.LLM_KV_STORE_BYTES, direction=direction) == 0
    assert value(found, names.LLM_KV_STORE_HITS) == 0
    assert value(found, f"{names.LLM_KV_STORE_FETCH_SECONDS}_count") == 0


def test_counters_are_the_clients_at_scrape_time_and_fetch_times_observed_once():
    stats = StoreStats(
        hits=10, misses=2, bytes_read=8192, bytes_written=16384, checksum_failures=2,
        dropped_writes=6, skipped_writes=4, errors=1,
    )  # fmt: skip
    metrics = LLMMetrics()
    metrics.watch_store(SimpleNamespace(stats=stats))
    metrics.observe_stats(engine_stats(snapshot(0.0007)))
    metrics.observe_stats(engine_stats(snapshot()))  # nothing new: nothing counted twice
    metrics.observe_stats(engine_stats(snapshot(0.003, 0.2)))
    found = samples(metrics)
    assert value(found, names.LLM_KV_STORE_CONFIGURED) == 1
    assert value(found, names.LLM_KV_STORE_UP) == 1
    assert value(found, names.LLM_KV_STORE_HITS) == 10
    assert value(found, names.LLM_KV_STORE_MISSES) == 2
    assert value(found, names.LLM_KV_STORE_BYTES, direction="read") == 8192
    assert value(found, names.LLM_KV_STORE_BYTES, direction="written") == 16384
    assert value(found, names.LLM_KV_STORE_CHECKSUM_FAILURES) == 2
    assert value(found, names.LLM_KV_STORE_DROPPED_WRITES) == 6
    assert value(found, names.LLM_KV_STORE_SKIPPED_WRITES) == 4
    assert value(found, names.LLM_KV_STORE_ERRORS) == 1
    assert value(found, f"{names.LLM_KV_STORE_FETCH_SECONDS}_count") == 3
    assert abs(value(found, f"{names.LLM_KV_STORE_FETCH_SECONDS}_sum") - 0.2037) < 1e-9
    assert value(found, f"{names.LLM_KV_STORE_FETCH_SECONDS}_bucket", le="0.001") == 1
    # The writer finishing after the last step shows at the next scrape, no step needed;
    # a failed store reads 0 until it is tried again.
    stats.bytes_written += 4096
    stats.available = False
    found = samples(metrics)
    assert value(found, names.LLM_KV_STORE_BYTES, direction="written") == 20480
    assert value(found, names.LLM_KV_STORE_UP) == 0


def _engine(store: KVStoreConfig) -> LLMEngine:
    config = EngineConfig(
        tiny_checkpoint("llama"), page_size=4, num_pages=32, max_num_seqs=2, max_model_len=48,
        dtype="float32", device="cpu", max_num_batched_tokens=16, host_kv_bytes=4 << 20,
        kv_store=store,
    )  # fmt: skip
    return LLMEngine(config)


def test_a_store_load_reaches_the_metrics():
    """One engine writes a conversation's pages, another (another pod: nothing shared but
    the store) loads them: its figures on the metrics are the client's, its lookup time
    taken out of the client once."""
    store = KVStoreConfig("memory", url=f"metrics-{next(_names)}")
    first = [(7 * i + 3) % 300 for i in range(26)]
    second = first + [(13 * i + 2) % 300 for i in range(6)]
    writer, writer_metrics = _engine(store), LLMMetrics()
    writer_metrics.watch_store(writer.kv_store)
    try:
        run_all(writer, {"first": (first, greedy(4))})
        writer_metrics.observe_stats(writer.stats())
        assert writer.kv_store.flush()
        written = value(samples(writer_metrics), names.LLM_KV_STORE_BYTES, direction="written")
        assert written == writer.kv_store.stats.bytes_written > 0
    finally:
        writer.close()
    reader, metrics = _engine(store), LLMMetrics()
    metrics.watch_store(reader.kv_store)
    try:
        run_all(reader, {"second": (second, greedy(4))})
        stats = reader.stats()
        metrics.observe_stats(stats)
        again = reader.stats()
        metrics.observe_stats(again)
        client = reader.kv_store.stats
        found = samples(metrics)
    finally:
        reader.close()
    assert stats.store is not None and len(stats.store.fetch_seconds) >= 1
    assert again.store is not None and again.store.fetch_seconds == ()
    assert client.fetch_seconds == []
    assert value(found, names.LLM_KV_STORE_HITS) == client.hits > 0
    assert value(found, names.LLM_KV_STORE_BYTES, direction="read") == client.bytes_read > 0
    assert value(found, names.LLM_KV_STORE_CONFIGURED) == 1
    assert value(found, names.LLM_KV_STORE_UP) == 1
    assert value(found, names.LLM_KV_STORE_CHECKSUM_FAILURES) == 0
    count = value(found, f"{names.LLM_KV_STORE_FETCH_SECONDS}_count")
    assert count == len(stats.store.fetch_seconds)
