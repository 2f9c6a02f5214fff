"""Goodput's pure parts: the declared SLO's rule, whether a load point meets an SLO, the
share of turns that do, the search for the highest offered rate that meets it, the
re-scoring of measured points at another bound, and how a ratio of goodputs is said.

Goodput is the highest offered rate (conversation starts per second) at which the turns
still meet a latency objective: P90 TTFT <= `ttft_s` and P90 TPOT <= `tpot_s`. The SLO is
declared before any loaded run, by one rule over an unloaded calibration of every mode
(`declared_slo`): 1.5 x the slowest mode's P90 TTFT over every turn and 1.5 x the slowest
P90 TPOT, rounded up to 100 ms and 10 ms; so every mode meets it unloaded, and no loaded
result can move it. A failed turn misses the SLO (it counts as an infinite TTFT and TPOT).

The search (`RateSearch`) first brackets the goodput: from a start rate it doubles while
points meet the SLO, or halves while they do not, then bisects the bracket `bisections`
times. No point is run above `max_rate` or below `min_rate`. The goodput is the highest
rate that met the SLO (0 when none did).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace


@dataclass(frozen=True)
class SLO:
    """P90 TTFT and P90 TPOT bounds, in seconds."""

    ttft_s: float
    tpot_s: float
    quantile: float = 90.0

    def describe(self) -> str:
        q = f"P{self.quantile:g}"
        return f"{q} TTFT <= {self.ttft_s * 1e3:.0f} ms and {q} TPOT <= {self.tpot_s * 1e3:.1f} ms"


DECLARED_FACTOR = 1.5
TTFT_STEP_MS = 100
TPOT_STEP_MS = 10


def round_up_ms(seconds: float, step_ms: int) -> float:
    """`seconds` rounded up to a whole number of `step_ms`, in seconds (0.6 s stays 0.6 s
    whatever float error 1.5 x 0.4 carries)."""
    steps = math.ceil(round(seconds * 1000 / step_ms, 6))
    return steps * step_ms / 1000


def declared_slo(
    ttft_p90_s: Mapping[str, float],
    tpot_p90_s: Mapping[str, float],
    factor: float = DECLARED_FACTOR,
) -> SLO:
    """The declared rule over each mode's unloaded P90s (seconds, by mode): `factor` x the
    slowest mode's TTFT rounded up to 100 ms, `factor` x the slowest TPOT to 10 ms."""
    for name, values in (("ttft_p90_s", ttft_p90_s), ("tpot_p90_s", tpot_p90_s)):
        if not values:
            raise ValueError(f"{name}: no mode calibrated")
        for mode, value in values.items():
            if not value > 0 or math.isinf(value):
                raise ValueError(
                    f"{name}[{mode!r}] must be a positive number of seconds, got {value}"
                )
    return SLO(
        round_up_ms(factor * max(ttft_p90_s.values()), TTFT_STEP_MS),
        round_up_ms(factor * max(tpot_p90_s.values()), TPOT_STEP_MS),
    )


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


def with_ttft_scaled(slo: SLO, factor: float) -> SLO:
    """The SLO with its TTFT bound times `factor` (the TPOT bound kept)."""
    return replace(slo, ttft_s=slo.ttft_s * factor)


@dataclass(frozen=True)
class Rescored:
    """A mode's goodput at another SLO from the points it ran: the highest rate whose turns
    meet it (0: none did), and whether the highest rate tried met it (the goodput is then
    at least that; the search never ran higher)."""

    goodput: float
    at_least: bool

    def describe(self) -> str:
        return f"{'>= ' if self.at_least else ''}{self.goodput:.3f}"


def rescore(points: Sequence[tuple[float, Sequence[TurnTiming]]], slo: SLO) -> Rescored:
    """Goodput at `slo` from measured points (rate, its turns); no point is run again."""
    met = [rate for rate, turns in points if meets_slo(turns, slo)]
    if not met:
        return Rescored(0.0, False)
    return Rescored(max(met), max(met) >= max(rate for rate, _ in points))


def ratio_line(mode: str, goodput: float, baseline_mode: str, baseline: float) -> str:
    """`mode`'s goodput over the baseline's; a ratio only where both met the SLO at some
    rate, else the mode (or modes) that met nothing, by name."""
    if goodput > 0 and baseline > 0:
        return f"{mode}/{baseline_mode} {goodput / baseline:.2f}"
    nothing = [name for name, value in ((mode, goodput), (baseline_mode, baseline)) if not value]
    return f"{mode}/{baseline_mode}: no ratio, {' and '.join(nothing)} met the SLO at no rate"


def target_verdict(goodput: float, baseline: float, target: float) -> str:
    """Against the target ratio: met, NOT met, or missed because a mode met nothing."""
    if goodput > 0 and baseline > 0:
        return "met" if goodput / baseline >= target else "NOT met"
    return "missed: no finite ratio"
