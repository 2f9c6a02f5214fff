"""The encoder's Prometheus metrics (names from iris.metrics) and its /metrics + /healthz
HTTP endpoint.

Each service instance owns its registry, so several encoders (tests, benchmarks) can live
in one process. Rates and the busy ratio are computed over a sliding window when scraped.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from iris import metrics as names

BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
STAGE_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)
# Where an encoded image's time goes, stage by stage (the label of ENCODER_STAGE_SECONDS).
STAGES = ("claim", "prepare", "batch_wait", "tower", "store")
RATE_WINDOW_S = 10.0


class SlidingWindow:
    """Amounts and busy intervals over the last `window_s` seconds (thread-safe: the tower
    thread reports busy time, the HTTP thread reads)."""

    def __init__(
        self, window_s: float = RATE_WINDOW_S, clock: Callable[[], float] = time.monotonic
    ):
        self._window_s = window_s
        self._clock = clock
        self._events: deque[tuple[float, float]] = deque()  # (time, amount)
        self._busy: deque[tuple[float, float]] = deque()  # (start, end)
        self._busy_since: float | None = None
        self._lock = threading.Lock()

    def add(self, amount: float) -> None:
        with self._lock:
            self._events.append((self._clock(), amount))

    def busy_start(self) -> None:
        with self._lock:
            self._busy_since = self._clock()

    def busy_end(self) -> None:
        with self._lock:
            if self._busy_since is not None:
                self._busy.append((self._busy_since, self._clock()))
                self._busy_since = None

    def _trim(self, now: float) -> float:
        horizon = now - self._window_s
        while self._events and self._events[0][0] < horizon:
            self._events.popleft()
        while self._busy and self._busy[0][1] < horizon:
            self._busy.popleft()
        return horizon

    def rate(self) -> float:
        """Amount per second over the window."""
        with self._lock:
            self._trim(self._clock())
            return sum(amount for _, amount in self._events) / self._window_s

    def busy_ratio(self) -> float:
        """Fraction of the window the tower spent running (a running call counts so far)."""
        with self._lock:
            now = self._clock()
            horizon = self._trim(now)
            busy = sum(end - max(start, horizon) for start, end in self._busy)
            if self._busy_since is not None:
                busy += now - max(self._busy_since, horizon)
            return min(1.0, max(0.0, busy / self._window_s))


class EncoderMetrics:
    """Every metric the encoder exports; `queue` reads the live (images, tokens) in flight."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        reg = self.registry
        self.images_window = SlidingWindow()
        self.tokens_window = SlidingWindow()
        self.tower_window = SlidingWindow()
        self._queue: Callable[[], tuple[int, int]] = lambda: (0, 0)
        self._submitted = 0
        self._deduplicated = 0
        # Gauges read live when scraped.
        for name, doc, read in (
            (names.ENCODER_QUEUED_IMAGES, "Distinct images accepted, not yet stored",
             lambda: self._queue()[0]),
            (names.ENCODER_QUEUED_VISION_TOKENS,
             "Vision tokens of distinct images accepted, not yet stored", lambda: self._queue()[1]),
            (names.ENCODER_BUSY_RATIO, "Fraction of recent time the vision tower ran",
             self.tower_window.busy_ratio),
            (names.ENCODER_DEDUP_RATIO,
             "Fraction of submitted images served without a tower run (in flight or cached)",
             self.dedup_ratio),
            (names.ENCODER_IMAGES_PER_SECOND, "Images encoded per second, recent",
             self.images_window.rate),
            (names.ENCODER_VISION_TOKENS_PER_SECOND, "Vision tokens encoded per second, recent",
             self.tokens_window.rate),
        ):  # fmt: skip
            Gauge(name, doc, registry=reg).set_function(read)
        self.batch_size = Histogram(
            names.ENCODER_BATCH_SIZE,
            "Images per vision tower call",
            buckets=BATCH_BUCKETS,
            registry=reg,
        )
        self.stage_seconds = Histogram(
            names.ENCODER_STAGE_SECONDS,
            "Seconds an encoded image spent in each stage: claim (cache Reserve), prepare "
            "(decode + preprocess, queueing for a worker included), batch_wait (ready until "
            "its tower call), tower, store (cache Put)",
            [names.LABEL_STAGE],
            buckets=STAGE_BUCKETS,
            registry=reg,
        )
        self.images = Counter(names.ENCODER_IMAGES, "Images encoded and stored", registry=reg)
        self.vision_tokens = Counter(
            names.ENCODER_VISION_TOKENS, "Vision tokens encoded and stored", registry=reg
        )
        self.failed = Counter(
            names.ENCODER_FAILED_IMAGES,
            "Images stored as failed(reason)",
            [names.LABEL_REASON],
            registry=reg,
        )
        self.rejected = Counter(
            names.ENCODER_REJECTED, "Requests refused because the queue was full", registry=reg
        )

    def watch_queue(self, queue: Callable[[], tuple[int, int]]) -> None:
        self._queue = queue

    def submitted(self, images: int, deduplicated: int) -> None:
        self._submitted += images
        self._deduplicated += deduplicated

    def dedup_ratio(self) -> float:
        return self._deduplicated / self._submitted if self._submitted else 0.0

    def stored(self, tokens: int) -> None:
        self.images.inc()
        self.vision_tokens.inc(tokens)
        self.images_window.add(1)
        self.tokens_window.add(tokens)
