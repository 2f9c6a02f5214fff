"""Goodput's pure parts: the SLO from a calibration, whether a load point meets it, the share
of turns that do, and the search for the highest offered rate that meets it.

Goodput is the highest offered rate (conversation starts per second) at which the turns
still meet a latency objective: P90 TTFT <= `ttft_s` and P90 TPOT <= `tpot_s`. The SLO is
set from an unloaded calibration: `ttft_factor` x its first-turn TTFT p50 and `tpot_factor`
x its TPOT p50 (3x and 2x by default). A failed turn misses the SLO (it counts as an
infinite TTFT and TPOT).

The search (`RateSearch`) first brackets the goodput: from a start rate it doubles while
points meet the SLO, or halves while they do not, then bisects the bracket `bisections`
times. No point is run above `max_rate` or below `min_rate`. The goodput is the highest
rate that met the SLO (0 when none did).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field


@dataclass(frozen=True)
class SLO:
    """P90 TTFT and P90 TPOT bounds, in seconds."""

    ttft_s: float
    tpot_s: float
    quantile: float = 90.0

    def describe(self) -> str:
        q = f"P{self.quantile:g}"
        return f"{q} TTFT <= {self.ttft_s * 1e3:.0f} ms and {q} TPOT <= {self.tpot_s * 1e3:.1f} ms"


def slo_from_calibration(
    ttft_p50_s: float, tpot_p50_s: float, ttft_factor: float = 3.0, tpot_factor: float = 2.0
) -> SLO:
    """The SLO as multiples of the unloaded first-turn TTFT p50 and TPOT p50."""
    for name, value in (("ttft_p50_s", ttft_p50_s), ("tpot_p50_s", tpot_p50_s)):
        if not value > 0 or math.isinf(value):
            raise ValueError(f"{name} must be a positive number of seconds, got {value}")
    return SLO(ttft_factor * ttft_p50_s, tpot_factor * tpot_p50_s)


@dataclass(frozen=True)
class TurnTiming:
    """What the SLO reads of one turn: its TTFT, its TPOT (None: one token or fewer, no
    TPOT) and whether it was answered at all."""

    ttft_s: float
    tpot_s: float | None
    ok: bool = True


def quantile(values: Sequence[float], q: float) -> float:
    """The q-th percentile, nearest rank on the sorted values (nan when empty)."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, math.ceil(q / 100 * len(ordered)) - 1)]


def point_quantiles(turns: Sequence[TurnTiming], q: float) -> tuple[float, float]:
    """(TTFT, TPOT) at quantile q over a point's turns; a failed turn is infinite in both."""
    ttfts = [t.ttft_s if t.ok else math.inf for t in turns]
    tpots = [t.tpot_s if t.ok else math.inf for t in turns if not t.ok or t.tpot_s is not None]
    return quantile(ttfts, q), quantile(tpots, q) if tpots else 0.0


def meets_slo(turns: Sequence[TurnTiming], slo: SLO) -> bool:
    """Whether a load point meets the SLO: both quantiles within bounds (no turns: no)."""
    if not turns:
        return False
    ttft, tpot = point_quantiles(turns, slo.quantile)
    return ttft <= slo.ttft_s and tpot <= slo.tpot_s


def share_meeting(turns: Sequence[TurnTiming], slo: SLO) -> float:
    """The share of turns that meet both bounds on their own (what the plot draws)."""
    if not turns:
        return 0.0
    good = sum(
        t.ok and t.ttft_s <= slo.ttft_s and (t.tpot_s is None or t.tpot_s <= slo.tpot_s)
        for t in turns
    )
    return good / len(turns)


@dataclass
class RateSearch:
    """Bracket, then bisect, the highest rate meeting the SLO. `next_rate()` says what to run
    next (None: done); `record(rate, met)` takes its outcome."""

    start: float
    bisections: int = 4
    factor: float = 2.0
    min_rate: float | None = None  # default start / factor**3
    max_rate: float | None = None  # default start x factor**4
    passed: float | None = None  # the highest rate that met the SLO
    failed: float | None = None  # the lowest rate that did not
    points: list[tuple[float, bool]] = field(default_factory=list)
    _bisected: int = 0

    def __post_init__(self) -> None:
        if not self.start > 0:
            raise ValueError(f"start rate must be > 0, got {self.start}")
        if self.factor <= 1:
            raise ValueError(f"factor must be > 1, got {self.factor}")
        if self.bisections < 0:
            raise ValueError(f"bisections must be >= 0, got {self.bisections}")
        if self.min_rate is None:
            self.min_rate = self.start / self.factor**3
        if self.max_rate is None:
            self.max_rate = self.start * self.factor**4

    @property
    def bracketed(self) -> bool:
        return self.passed is not None and self.failed is not None

    @property
    def goodput(self) -> float:
        return self.passed or 0.0

    def next_rate(self) -> float | None:
        if not self.points:
            return self.start
        if self.bracketed:
            if self._bisected >= self.bisections:
                return None
            return (self.passed + self.failed) / 2
        if self.failed is None:  # every point met it: go up, to max_rate at most
            if self.passed >= self.max_rate:
                return None
            return min(self.passed * self.factor, self.max_rate)
        # every point missed: go down, to min_rate at most
        if self.failed <= self.min_rate:
            return None
        return max(self.failed / self.factor, self.min_rate)

    def record(self, rate: float, met: bool) -> None:
        was_bracketed = self.bracketed
        self.points.append((rate, met))
        if met:
            self.passed = rate if self.passed is None else max(self.passed, rate)
        else:
            self.failed = rate if self.failed is None else min(self.failed, rate)
        if was_bracketed:
            self._bisected += 1


def ratio_verdict(goodput: float, baseline: float, target: float) -> str:
    """`goodput / baseline` against `target`, said plainly when either is zero (no rate
    tried met the SLO): a ratio over nothing is no ratio."""
    if baseline == 0 and goodput == 0:
        return "undefined: neither met the SLO at any rate tried"
    if baseline == 0:
        return f"unbounded: the baseline met the SLO at no rate tried (target >= {target:g})"
    ratio = goodput / baseline
    return f"{ratio:.2f} (target >= {target:g}: {'met' if ratio >= target else 'NOT met'})"
