"""Speculative decoding on the pod: its settings reach the engine (IRIS_LLM_* through
LLMSettings and engine_config), and EngineStats' counters by draft method reach /metrics,
advanced by what grew between snapshots."""

from __future__ import annotations

from iris import metrics as names
from llm_svc.engine import EngineStats
from llm_svc.server.builder import engine_config
from llm_svc.server.metrics import LLMMetrics
from llm_svc.settings import LLMSettings
from tests.llm_svc.checkpoints import tiny_checkpoint
from tests.llm_svc.server.test_tier_metrics import samples


def _stats(proposed: int, accepted: int, verifications: int) -> EngineStats:
    return EngineStats(
        running=0, waiting=0, kv_utilisation=0.0, num_pages=1, pending_prefill_tokens=0,
        preemptions=0, prompt_tokens=0, prefix_hit_tokens=0, generation_tokens=0,
        spec_proposed={"ngram": proposed}, spec_accepted={"ngram": accepted},
        spec_verifications={"ngram": verifications},
    )  # fmt: skip


def test_settings_reach_the_engine_config(monkeypatch):
    monkeypatch.setenv("IRIS_LLM_NUM_SPECULATIVE_TOKENS", "3")
    monkeypatch.setenv("IRIS_LLM_SPECULATIVE_MIN_ACCEPTANCE", "0.2")
    monkeypatch.setenv("IRIS_LLM_SPECULATIVE_MAX_BATCH", "8")
    config = engine_config(LLMSettings(model=str(tiny_checkpoint("llama"))))
    assert (config.num_speculative_tokens, config.speculative_method) == (3, "ngram")
    assert (config.speculative_min_acceptance, config.speculative_max_batch) == (0.2, 8)
    assert config.overlap_scheduling is False  # the accepted tokens decide the next inputs


def test_counters_by_method_follow_the_snapshots():
    metrics = LLMMetrics()
    metrics.observe_stats(_stats(8, 5, 2))
    metrics.observe_stats(_stats(12, 6, 3))
    label = (("method", "ngram"),)
    exported = samples(metrics)
    assert exported[(names.LLM_SPEC_DRAFT_TOKENS, label)] == 12
    assert exported[(names.LLM_SPEC_ACCEPTED_TOKENS, label)] == 6
    assert exported[(names.LLM_SPEC_VERIFICATIONS, label)] == 3
