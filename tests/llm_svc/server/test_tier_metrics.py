"""The host KV tier's figures on the pod's /metrics: EngineStats carries a snapshot of the
tier's counters (llm_svc/engine/outputs.py, TierSnapshot), the metrics advance by what
grew between snapshots, and each request's load time is observed once."""

from __future__ import annotations

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from iris import metrics as names
from llm_svc.engine import EngineConfig, EngineStats, LLMEngine
from llm_svc.engine.outputs import TierSnapshot
from llm_svc.server.metrics import LLMMetrics
from tests.llm_svc.checkpoints import tiny_checkpoint
from tests.llm_svc.conftest import greedy, run_all

TIER_METRICS = [
    names.LLM_KV_TIER_PAGES,
    names.LLM_KV_TIER_HITS,
    names.LLM_KV_TIER_MISSES,
    names.LLM_KV_TIER_BYTES,
    names.LLM_KV_TIER_LOAD_FAILURES,
    names.LLM_KV_TIER_DROPPED,
    names.LLM_KV_TIER_LOAD_SECONDS,
    names.LLM_KV_TIER_FILL_RATIO,
    names.LLM_KV_TIER_CAPACITY_BYTES,
    names.LLM_KV_TIER_HOST_HIT_TOKENS,
]


def samples(metrics: LLMMetrics) -> dict[tuple[str, tuple], float]:
    """{(sample name, sorted labels): value} of everything the registry exports."""
    text = generate_latest(metrics.registry).decode()
    out = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return out


def value(found: dict, name: str, **labels: str) -> float:
    return found[(name, tuple(sorted(labels.items())))]


def engine_stats(tier: TierSnapshot | None) -> EngineStats:
    return EngineStats(
        running=0, waiting=0, kv_utilisation=0.0, num_pages=8, pending_prefill_tokens=0,
        preemptions=0, prompt_tokens=0, prefix_hit_tokens=0, generation_tokens=0, tier=tier,
    )  # fmt: skip


def snapshot(scale: int, load_seconds: tuple[float, ...] = ()) -> TierSnapshot:
    return TierSnapshot(
        page_lookups={"device": 4 * scale, "host": 3 * scale, "miss": scale},
        hits={"page": 3 * scale, "window": 2 * scale, "state": scale},
        misses={"page": scale, "window": 0, "state": 0},
        bytes_to_host=1000 * scale,
        bytes_to_device=600 * scale,
        load_failures=scale,
        dropped_full=2 * scale,
        host_hit_tokens=12 * scale,
        load_seconds=load_seconds,
        fill=0.25 * scale,
        capacity_bytes=4096,
    )


def test_every_tier_series_is_exported_at_zero_without_a_tier():
    metrics = LLMMetrics()
    metrics.observe_stats(engine_stats(None))
    found = samples(metrics)
    for name in TIER_METRICS:
        assert any(key[0].startswith(name) for key in found), f"{name} not exported"
    for tier in ("device", "host", "miss"):
        assert value(found, names.LLM_KV_TIER_PAGES, tier=tier) == 0
    for kind in ("page", "window", "state"):
        assert value(found, names.LLM_KV_TIER_HITS, kind=kind) == 0
        assert value(found, names.LLM_KV_TIER_MISSES, kind=kind) == 0
    for direction in ("to_host", "to_device"):
        assert value(found, names.LLM_KV_TIER_BYTES, direction=direction) == 0
    assert value(found, names.LLM_KV_TIER_CAPACITY_BYTES) == 0
    assert value(found, f"{names.LLM_KV_TIER_LOAD_SECONDS}_count") == 0


def test_counters_follow_the_snapshots_and_load_times_are_observed_once():
    metrics = LLMMetrics()
    metrics.observe_stats(engine_stats(snapshot(1, (0.002,))))
    metrics.observe_stats(engine_stats(snapshot(1)))  # nothing new: nothing counted twice
    metrics.observe_stats(engine_stats(snapshot(2, (0.03, 0.4))))
    found = samples(metrics)
    assert value(found, names.LLM_KV_TIER_PAGES, tier="device") == 8
    assert value(found, names.LLM_KV_TIER_PAGES, tier="host") == 6
    assert value(found, names.LLM_KV_TIER_PAGES, tier="miss") == 2
    assert value(found, names.LLM_KV_TIER_HITS, kind="window") == 4
    assert value(found, names.LLM_KV_TIER_HITS, kind="state") == 2
    assert value(found, names.LLM_KV_TIER_MISSES, kind="page") == 2
    assert value(found, names.LLM_KV_TIER_BYTES, direction="to_host") == 2000
    assert value(found, names.LLM_KV_TIER_BYTES, direction="to_device") == 1200
    assert value(found, names.LLM_KV_TIER_LOAD_FAILURES) == 2
    assert value(found, names.LLM_KV_TIER_DROPPED) == 4
    assert value(found, names.LLM_KV_TIER_HOST_HIT_TOKENS) == 24
    assert value(found, names.LLM_KV_TIER_FILL_RATIO) == 0.5
    assert value(found, names.LLM_KV_TIER_CAPACITY_BYTES) == 4096
    assert value(found, f"{names.LLM_KV_TIER_LOAD_SECONDS}_count") == 3
    assert abs(value(found, f"{names.LLM_KV_TIER_LOAD_SECONDS}_sum") - 0.432) < 1e-9
    assert value(found, f"{names.LLM_KV_TIER_LOAD_SECONDS}_bucket", le="0.0025") == 1


def test_a_host_hit_reaches_the_metrics_through_engine_stats():
    """A conversation pushed off a device pool of a few pages comes back from host memory;
    the engine's stats carry it to the metrics, its load time taken out of the tier once."""
    page, vocab = 4, 300
    config = EngineConfig(tiny_checkpoint("llama"), page_size=page, num_pages=12,
                          max_num_seqs=2, max_model_len=44, dtype="float32", device="cpu",
                          max_num_batched_tokens=16, host_kv_bytes=4 << 20)  # fmt: skip
    engine = LLMEngine(config)
    metrics = LLMMetrics()
    try:
        first = [(7 * i + 3) % vocab for i in range(26)]
        others = [[(11 * i + 5 * k + 1) % vocab for i in range(30)] for k in range(3)]
        for index, prompt in enumerate([first, *others]):
            run_all(engine, {f"turn{index}": (prompt, greedy(4))})
            metrics.observe_stats(engine.stats())
        second = first + [(13 * i + 2) % vocab for i in range(6)]
        out = run_all(engine, {"second": (second, greedy(4))})["second"]
        stats = engine.stats()
        metrics.observe_stats(stats)
        again = engine.stats()  # the load times were taken by the call before
        metrics.observe_stats(again)
        tier = engine.runner.host_tier
    finally:
        engine.close()
    assert stats.tier is not None and again.tier is not None
    assert len(stats.tier.load_seconds) == 1 and again.tier.load_seconds == ()
    assert tier.stats.load_seconds == []
    found = samples(metrics)
    host_pages = value(found, names.LLM_KV_TIER_PAGES, tier="host")
    assert host_pages == tier.stats.page_lookups["host"] > 0
    assert value(found, names.LLM_KV_TIER_HITS, kind="page") == tier.stats.hits["page"] > 0
    to_host = value(found, names.LLM_KV_TIER_BYTES, direction="to_host")
    assert to_host == tier.stats.bytes_to_host > 0
    to_device = value(found, names.LLM_KV_TIER_BYTES, direction="to_device")
    assert to_device == tier.stats.bytes_to_device > 0
    host_tokens = value(found, names.LLM_KV_TIER_HOST_HIT_TOKENS)
    assert host_tokens == host_pages * page <= out[-1].num_cached_tokens
    assert value(found, f"{names.LLM_KV_TIER_LOAD_SECONDS}_count") == 1
    assert value(found, names.LLM_KV_TIER_CAPACITY_BYTES) == tier.sizing.total_bytes > 0
    assert 0 < value(found, names.LLM_KV_TIER_FILL_RATIO) <= 1
