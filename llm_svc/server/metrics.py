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
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from iris import metrics as names
from llm_svc.engine import EngineStats
from llm_svc.engine.config import SPECULATIVE_METHODS
from llm_svc.engine.host_tier import KINDS as TIER_KINDS
from llm_svc.engine.outputs import StoreSnapshot, TierSnapshot

TTFT_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
TPOT_BUCKETS = (0.002, 0.005, 0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56)
# A request's loads from the host tier: a page within RAM takes microseconds, gigabytes
# over PCIe tens to hundreds of milliseconds.
TIER_LOAD_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
TIER_PLACES = ("device", "host", "miss")  # where a prompt's full pages were (page lookups)
TIER_DIRECTIONS = ("to_host", "to_device")
# A store lookup: one round trip per 64 pages to a Redis on the same network takes about a
# millisecond; a slow or distant store up to its timeout (IRIS_LLM_KV_STORE_TIMEOUT_S).
STORE_FETCH_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0)


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
        self._tier_metrics(reg)
        self._store_metrics(reg)
        self._spec_metrics(reg)
        self.tokens_per_second = Gauge(
            names.LLM_TOKENS_PER_SECOND, "Generated tokens per second", registry=reg
        )
        self.tokens_per_second.set_function(self._rate)
        self._lock = threading.Lock()
        self._samples: deque[tuple[float, int]] = deque()  # (when, tokens)
        self._admitted_prompt = self._admitted_hits = 0
        self._preemptions = 0
        self._tier_seen: dict[tuple[str, str], int] = {}  # the tier's counters, last seen

    def _tier_metrics(self, reg: CollectorRegistry) -> None:
        """The host KV tier's series, each labelled one exported from the start (0 on a pod
        without the tier), so the dashboard's panels and the recording rules have data."""
        self.tier_pages = Counter(
            names.LLM_KV_TIER_PAGES, "Full prompt pages looked up, by where they were",
            [names.LABEL_TIER], registry=reg,
        )  # fmt: skip
        self.tier_hits = Counter(
            names.LLM_KV_TIER_HITS, "Units copied back from the host KV tier, by kind",
            [names.LABEL_KIND], registry=reg,
        )  # fmt: skip
        self.tier_misses = Counter(
            names.LLM_KV_TIER_MISSES,
            "Units the host KV tier held that could not be copied back, by kind",
            [names.LABEL_KIND], registry=reg,
        )  # fmt: skip
        self.tier_bytes = Counter(
            names.LLM_KV_TIER_BYTES, "Bytes copied between the device and the host KV tier",
            [names.LABEL_DIRECTION], registry=reg,
        )  # fmt: skip
        self.tier_load_failures = Counter(
            names.LLM_KV_TIER_LOAD_FAILURES,
            "Copies back from the host KV tier that failed (their tokens were prefilled)",
            registry=reg,
        )
        self.tier_dropped = Counter(
            names.LLM_KV_TIER_DROPPED,
            "Units the device let go that the host KV tier had no room for",
            registry=reg,
        )
        self.tier_load_seconds = Histogram(
            names.LLM_KV_TIER_LOAD_SECONDS,
            "Per request that loaded from the host KV tier, the time its loads took",
            buckets=TIER_LOAD_BUCKETS, registry=reg,
        )  # fmt: skip
        self.tier_fill = Gauge(
            names.LLM_KV_TIER_FILL_RATIO, "Share of the host KV tier's bytes in use, 0..1",
            registry=reg,
        )  # fmt: skip
        self.tier_capacity = Gauge(
            names.LLM_KV_TIER_CAPACITY_BYTES, "Bytes of the host KV tier (0: none)", registry=reg
        )
        self.tier_host_hit_tokens = Counter(
            names.LLM_KV_TIER_HOST_HIT_TOKENS,
            "Prompt tokens served from the host KV tier (part of the prefix-cache hits)",
            registry=reg,
        )
        for place in TIER_PLACES:
            self.tier_pages.labels(place)
        for kind in TIER_KINDS:
            self.tier_hits.labels(kind)
            self.tier_misses.labels(kind)
        for direction in TIER_DIRECTIONS:
            self.tier_bytes.labels(direction)

    def _store_metrics(self, reg: CollectorRegistry) -> None:
        """The shared KV store's series, exported from the start (0 on a pod without a
        store, whose `configured` is 0: the alert and the dashboard tell it apart from a
        store that is down). Its counters are read from the client at scrape time
        (StoreCollector): the writer thread adds to them after the last step, and an idle
        engine takes no snapshot, so a snapshot's figures would lag until the next
        request. The lookup times, drained on the engine thread, come with the snapshots."""
        self.store_collector = StoreCollector()
        reg.register(self.store_collector)
        self.store_fetch_seconds = Histogram(
            names.LLM_KV_STORE_FETCH_SECONDS, "Per KV store lookup, the time it took",
            buckets=STORE_FETCH_BUCKETS, registry=reg,
        )  # fmt: skip

    def watch_store(self, client) -> None:
        """Export the KV store client's counters (llm_svc/engine/kv_store.py,
        KVStoreClient; None: no store, every series at 0)."""
        self.store_collector.client = client

    def watch_grammars(self, pool) -> None:
        """Export the grammar compile pool's counts (read at scrape time)."""
        self.registry.register(GrammarCollector(pool))

    def _spec_metrics(self, reg: CollectorRegistry) -> None:
        method = [names.LABEL_METHOD]
        self.spec_drafts = Counter(
            names.LLM_SPEC_DRAFT_TOKENS, "Draft tokens proposed", method, registry=reg
        )
        self.spec_accepted = Counter(
            names.LLM_SPEC_ACCEPTED_TOKENS, "Draft tokens accepted", method, registry=reg
        )
        self.spec_verifications = Counter(
            names.LLM_SPEC_VERIFICATIONS, "Verifications (sequence steps with drafts)", method,
            registry=reg,
        )  # fmt: skip
        # Every method's series exists from the start, at 0 (a pod without speculation
        # too): a panel shows 0, never "no data".
        for name in SPECULATIVE_METHODS:
            for counter in (self.spec_drafts, self.spec_accepted, self.spec_verifications):
                counter.labels(name)

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
        for method, count in stats.spec_proposed.items():
            self._advance(self.spec_drafts.labels(method), ("spec_drafts", method), count)
        for method, count in stats.spec_accepted.items():
            self._advance(self.spec_accepted.labels(method), ("spec_accepted", method), count)
        for method, count in stats.spec_verifications.items():
            key = ("spec_verifications", method)
            self._advance(self.spec_verifications.labels(method), key, count)
        if stats.tier is not None:
            self._observe_tier(stats.tier)
        if stats.store is not None:
            self._observe_store(stats.store)

    def _observe_tier(self, tier: TierSnapshot) -> None:
        """The tier's counters advance by what grew since the last snapshot; its load times
        are each in one snapshot only."""
        for place, count in tier.page_lookups.items():
            self._advance(self.tier_pages.labels(place), ("pages", place), count)
        for kind, count in tier.hits.items():
            self._advance(self.tier_hits.labels(kind), ("hits", kind), count)
        for kind, count in tier.misses.items():
            self._advance(self.tier_misses.labels(kind), ("misses", kind), count)
        self._advance(self.tier_bytes.labels("to_host"), ("bytes", "to_host"), tier.bytes_to_host)
        self._advance(
            self.tier_bytes.labels("to_device"), ("bytes", "to_device"), tier.bytes_to_device
        )
        self._advance(self.tier_load_failures, ("load_failures", ""), tier.load_failures)
        self._advance(self.tier_dropped, ("dropped", ""), tier.dropped_full)
        self._advance(self.tier_host_hit_tokens, ("host_hit_tokens", ""), tier.host_hit_tokens)
        for seconds in tier.load_seconds:
            self.tier_load_seconds.observe(seconds)
        self.tier_fill.set(tier.fill)
        self.tier_capacity.set(tier.capacity_bytes)

    def _observe_store(self, store: StoreSnapshot) -> None:
        """Each lookup time once (the counters are read at scrape time: StoreCollector)."""
        for seconds in store.fetch_seconds:
            self.store_fetch_seconds.observe(seconds)

    def _advance(self, counter, key: tuple[str, str], total: int) -> None:
        seen = self._tier_seen.get(key, 0)
        if total > seen:
            counter.inc(total - seen)
            self._tier_seen[key] = total

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


class StoreCollector(Collector):
    """The KV store client's counters since start and whether it is in use, read at scrape
    time (ints the engine and writer threads add to; a read of one is atomic)."""

    def __init__(self, client=None) -> None:
        self.client = client

    def collect(self):
        stats = self.client.stats if self.client is not None else None

        def counter(name: str, text: str, field: str):
            value = getattr(stats, field) if stats is not None else 0
            return CounterMetricFamily(name.removesuffix("_total"), text, value=value)

        yield GaugeMetricFamily(
            names.LLM_KV_STORE_CONFIGURED, "1 when a KV store is configured, 0 when off",
            value=1 if stats is not None else 0,
        )  # fmt: skip
        yield GaugeMetricFamily(
            names.LLM_KV_STORE_UP,
            "1 while the KV store is used, 0 after a failure (for its retry time) or when off",
            value=1 if stats is not None and stats.available else 0,
        )
        yield counter(names.LLM_KV_STORE_HITS, "Pages read from the KV store", "hits")
        yield counter(
            names.LLM_KV_STORE_MISSES,
            "KV store lookups that ended at a page the store did not hold",
            "misses",
        )
        moved = CounterMetricFamily(
            names.LLM_KV_STORE_BYTES.removesuffix("_total"),
            "Page bytes read from and written to the KV store",
            labels=[names.LABEL_DIRECTION],
        )
        for direction, field in (("read", "bytes_read"), ("written", "bytes_written")):
            moved.add_metric([direction], getattr(stats, field) if stats is not None else 0)
        yield moved
        yield counter(
            names.LLM_KV_STORE_CHECKSUM_FAILURES,
            "KV store values whose checksum failed (dropped, never served)",
            "checksum_failures",
        )
        yield counter(
            names.LLM_KV_STORE_DROPPED_WRITES,
            "Pages not written to the KV store (the write queue full, or the store failing)",
            "dropped_writes",
        )
        yield counter(
            names.LLM_KV_STORE_SKIPPED_WRITES,
            "Pages not written to the KV store: their buffer was reused first",
            "skipped_writes",
        )
        yield counter(names.LLM_KV_STORE_ERRORS, "KV store round trips that failed", "errors")
