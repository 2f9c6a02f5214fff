"""The shared KV store's figures on the pod's /metrics: EngineStats carries a snapshot of
the store client's counters (llm_svc/engine/outputs.py, StoreSnapshot), the metrics
advance by what grew between snapshots, and each lookup's time is observed once."""

from __future__ import annotations

from iris import metrics as names
from llm_svc.engine import EngineStats
from llm_svc.engine.outputs import StoreSnapshot
from llm_svc.server.metrics import LLMMetrics
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


def engine_stats(store: StoreSnapshot | None) -> EngineStats:
    return EngineStats(
        running=0, waiting=0, kv_utilisation=0.0, num_pages=8, pending_prefill_tokens=0,
        preemptions=0, prompt_tokens=0, prefix_hit_tokens=0, generation_tokens=0, store=store,
    )  # fmt: skip


def snapshot(
    scale: int, fetch_seconds: tuple[float, ...] = (), available: bool = True
) -> StoreSnapshot:
    return StoreSnapshot(
        hits=5 * scale,
        misses=scale,
        bytes_read=4096 * scale,
        bytes_written=8192 * scale,
        checksum_failures=scale,
        dropped_writes=3 * scale,
        skipped_writes=2 * scale,
        errors=scale,
        available=available,
        fetch_seconds=fetch_seconds,
    )


def test_every_store_series_is_exported_at_zero_without_a_store():
    metrics = LLMMetrics()
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


def test_counters_follow_the_snapshots_and_fetch_times_are_observed_once():
    metrics = LLMMetrics()
    metrics.observe_stats(engine_stats(snapshot(1, (0.0007,))))
    metrics.observe_stats(engine_stats(snapshot(1)))  # nothing new: nothing counted twice
    metrics.observe_stats(engine_stats(snapshot(2, (0.003, 0.2))))
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
    assert value(found, names.LLM_KV_STORE_ERRORS) == 2
    assert value(found, f"{names.LLM_KV_STORE_FETCH_SECONDS}_count") == 3
    assert abs(value(found, f"{names.LLM_KV_STORE_FETCH_SECONDS}_sum") - 0.2037) < 1e-9
    assert value(found, f"{names.LLM_KV_STORE_FETCH_SECONDS}_bucket", le="0.001") == 1
    # A failed store reads 0 until it is tried again.
    metrics.observe_stats(engine_stats(snapshot(3, available=False)))
    assert value(samples(metrics), names.LLM_KV_STORE_UP) == 0
    assert value(samples(metrics), names.LLM_KV_STORE_ERRORS) == 3
