"""The LLM pod's Prometheus metrics, under the names in iris.metrics.

The engine thread writes them (prometheus_client is thread-safe); /metrics reads them.
Tokens per second is computed when scraped, over the last `window_s`, so an idle pod
reads 0 rather than its last busy rate.
"""

from __future__ import annotations

import threading
import time
from collections import deque

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily
from prometheus_client.registry import Collector

from iris import metrics as names
from llm_svc.engine import EngineStats

TTFT_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
TPOT_BUCKETS = (0.002, 0.005, 0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56)


class LLMMetrics:
    """One registry per server; `observe_*` calls come from the engine thread."""

    def __init__(self, window_s: float = 10.0) -> None:
        self.registry = CollectorRegistry()
        self.window_s = window_s
        reg = self.registry
        self.kv_utilisation = Gauge(names.LLM_KV_UTILISATION, "KV pages in use, 0..1", registry=reg)
        self.kv_capacity = Gauge(
            names.LLM_KV_SEQUENCE_CAPACITY,
            "Sequences of max_model_len the KV pages hold at once, each decoding",
            registry=reg,
        )
        self.running = Gauge(names.LLM_REQUESTS_RUNNING, "Requests running", registry=reg)
        self.waiting = Gauge(names.LLM_REQUESTS_WAITING, "Requests waiting", registry=reg)
        self.pending_prefill = Gauge(
            names.LLM_PENDING_PREFILL_TOKENS, "Prompt tokens still to prefill", registry=reg
        )
        self.hit_rate = Gauge(
            names.LLM_PREFIX_HIT_RATE, "Prompt tokens served by the prefix cache", registry=reg
        )
        self.hit_tokens = Counter(
            names.LLM_PREFIX_HIT_TOKENS, "Prompt tokens served by the prefix cache", registry=reg
        )
        self.prompt_tokens = Counter(
            names.LLM_PROMPT_TOKENS, "Prompt tokens admitted", registry=reg
        )
        self.generation_tokens = Counter(
            names.LLM_GENERATION_TOKENS, "Tokens generated", registry=reg
        )
        self.image_tokens = Counter(names.LLM_IMAGE_TOKENS, "Image tokens admitted", registry=reg)
        self.ttft = Histogram(
            names.LLM_TTFT_SECONDS, "Arrival to first token", buckets=TTFT_BUCKETS, registry=reg
        )
        self.tpot = Histogram(
            names.LLM_TPOT_SECONDS, "Mean time per output token after the first",
            buckets=TPOT_BUCKETS, registry=reg,
        )  # fmt: skip
        self.finished = Counter(
            names.LLM_REQUESTS_FINISHED, "Requests finished", [names.LABEL_REASON], registry=reg
        )
        self.preemptions = Counter(names.LLM_PREEMPTIONS, "Requests preempted", registry=reg)
        self.tokens_per_second = Gauge(
            names.LLM_TOKENS_PER_SECOND, "Generated tokens per second", registry=reg
        )
        self.tokens_per_second.set_function(self._rate)
        self._lock = threading.Lock()
        self._samples: deque[tuple[float, int]] = deque()  # (when, tokens)
        self._admitted_prompt = self._admitted_hits = 0
        self._preemptions = 0

    def watch_grammars(self, pool) -> None:
        """Export the grammar compile pool's counts (read at scrape time)."""
        self.registry.register(GrammarCollector(pool))

    # --- engine thread -----------------------------------------------------------------
    def observe_stats(self, stats: EngineStats) -> None:
        self.kv_utilisation.set(stats.kv_utilisation)
        self.kv_capacity.set(stats.sequence_capacity)
        self.running.set(stats.running)
        self.waiting.set(stats.waiting)
        self.pending_prefill.set(stats.pending_prefill_tokens)
        if stats.preemptions > self._preemptions:
            self.preemptions.inc(stats.preemptions - self._preemptions)
            self._preemptions = stats.preemptions

    def observe_admitted(self, prompt_tokens: int, cached_tokens: int, image_tokens: int) -> None:
        self.prompt_tokens.inc(prompt_tokens)
        self.hit_tokens.inc(cached_tokens)
        self.image_tokens.inc(image_tokens)
        self._admitted_prompt += prompt_tokens
        self._admitted_hits += cached_tokens
        self.hit_rate.set(self._admitted_hits / self._admitted_prompt)

    def observe_tokens(self, count: int) -> None:
        if count <= 0:
            return
        self.generation_tokens.inc(count)
        now = time.monotonic()
        with self._lock:
            self._samples.append((now, count))
            self._forget_before(now - self.window_s)

    def observe_first_token(self, seconds: float) -> None:
        self.ttft.observe(seconds)

    def observe_finished(self, reason: str, time_per_token_s: float | None) -> None:
        self.finished.labels(reason).inc()
        if time_per_token_s is not None:
            self.tpot.observe(time_per_token_s)

    # --- scrape ------------------------------------------------------------------------
    def _rate(self) -> float:
        """Tokens generated in the last `window_s` seconds, per second."""
        now = time.monotonic()
        with self._lock:
            self._forget_before(now - self.window_s)
            return sum(count for _, count in self._samples) / self.window_s

    def _forget_before(self, cutoff: float) -> None:
        while self._samples and self._samples[0][0] < cutoff:
            self._samples.popleft()


class GrammarCollector(Collector):
    """The compile pool's counters: compiles started (cache misses) and compiles killed
    with their worker at the compile timeout (llm_svc/engine/grammar/compiler.py)."""

    def __init__(self, pool) -> None:
        self.pool = pool

    def collect(self):
        yield CounterMetricFamily(
            names.LLM_GRAMMAR_COMPILES.removesuffix("_total"),
            "Grammar compiles started",
            value=self.pool.num_compiled,
        )
        yield CounterMetricFamily(
            names.LLM_GRAMMAR_COMPILE_TIMEOUTS.removesuffix("_total"),
            "Grammar compiles killed with their worker at the compile timeout",
            value=self.pool.num_timed_out,
        )
