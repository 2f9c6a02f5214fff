"""Goodput's pure logic (bench/goodput_search.py): the declared SLO's rule, whether a point
meets an SLO, the bracket-then-bisect search over offered rates, re-scoring measured points
at another bound, and how ratios are said."""

import math

import pytest

from bench.goodput_search import (
    SLO,
    RateSearch,
    Rescored,
    TurnTiming,
    declared_slo,
    meets_slo,
    point_quantiles,
    quantile,
    ratio_line,
    rescore,
    round_up_ms,
    share_meeting,
    target_verdict,
    with_ttft_scaled,
)


def test_the_declared_slo_is_one_and_a_half_times_the_slowest_mode_rounded_up():
    # (b) is the slowest in TTFT, (c) in TPOT: each bound follows its own slowest mode.
    ttft = {"a": 0.31, "b": 2.47, "c": 0.52}
    tpot = {"a": 0.081, "b": 0.090, "c": 0.093}
    slo = declared_slo(ttft, tpot)
    assert slo.ttft_s == 3.8  # 1.5 x 2.47 = 3.705 -> 3,800 ms
    assert slo.tpot_s == 0.14  # 1.5 x 0.093 = 0.1395 -> 140 ms
    assert "P90 TTFT <= 3800 ms and P90 TPOT <= 140.0 ms" in slo.describe()
    # Every mode meets the declared SLO at its own unloaded P90s, by construction.
    for mode in ttft:
        assert ttft[mode] <= slo.ttft_s and tpot[mode] <= slo.tpot_s


def test_rounding_up_keeps_a_whole_step_whole():
    assert round_up_ms(1.5 * 0.4, 100) == 0.6  # 0.6000000000000001 is not 700 ms
    assert round_up_ms(0.6001, 100) == 0.7
    assert round_up_ms(1.5 * 0.02, 10) == 0.03
    assert round_up_ms(0.0301, 10) == 0.04


@pytest.mark.parametrize("bad", [0.0, -1.0, float("nan"), float("inf")])
def test_a_calibration_without_a_figure_is_refused(bad):
    with pytest.raises(ValueError, match=r"ttft_p90_s\['b'\] must be a positive"):
        declared_slo({"a": 0.5, "b": bad}, {"a": 0.02, "b": 0.02})
    with pytest.raises(ValueError, match="no mode calibrated"):
        declared_slo({}, {})


def test_quantile_is_nearest_rank():
    values = list(range(1, 11))  # 1..10
    assert quantile(values, 90) == 9
    assert quantile(values, 50) == 5
    assert quantile(values, 100) == 10
    assert math.isnan(quantile([], 90))


def turns(ttfts, tpot=0.01):
    return [TurnTiming(t, tpot) for t in ttfts]


def test_a_point_meets_the_slo_by_its_p90s():
    slo = SLO(ttft_s=1.0, tpot_s=0.05)
    # 9 of 10 fast: the P90 is the 9th, fast; a tenth slow turn does not break it.
    assert meets_slo(turns([0.5] * 9 + [9.0]), slo)
    assert not meets_slo(turns([0.5] * 8 + [9.0] * 2), slo)
    assert not meets_slo(turns([0.5] * 10, tpot=0.06), slo)
    assert not meets_slo([], slo)


def test_failed_turns_miss_and_turns_without_a_tpot_do_not_count_for_it():
    slo = SLO(ttft_s=1.0, tpot_s=0.05)
    failed = turns([0.5] * 8) + [TurnTiming(0, None, ok=False)] * 2
    assert point_quantiles(failed, 90)[0] == math.inf
    assert not meets_slo(failed, slo)
    one_token = turns([0.5] * 9, tpot=0.01) + [TurnTiming(0.5, None)]
    assert meets_slo(one_token, slo)


def test_share_meeting_counts_each_turn_on_its_own():
    slo = SLO(ttft_s=1.0, tpot_s=0.05)
    mixed = turns([0.5, 0.5, 2.0]) + [TurnTiming(0.5, 0.1), TurnTiming(0, None, ok=False)]
    assert share_meeting(mixed, slo) == pytest.approx(2 / 5)
    assert share_meeting([], slo) == 0


def run(search: RateSearch, capacity: float) -> list[float]:
    """Drive the search against a platform that meets the SLO up to `capacity`."""
    rates = []
    while (rate := search.next_rate()) is not None:
        rates.append(rate)
        search.record(rate, rate <= capacity)
    return rates


def test_search_brackets_upward_then_bisects_four_times():
    search = RateSearch(start=0.1, bisections=4)
    rates = run(search, capacity=0.33)
    assert rates[:3] == pytest.approx([0.1, 0.2, 0.4])  # 0.4 fails: bracket [0.2, 0.4]
    assert len(rates) == 3 + 4
    assert 0.2 < search.goodput <= 0.33
    assert search.failed - search.passed == pytest.approx(0.2 / 2**4)


def test_search_brackets_downward_when_the_start_misses():
    search = RateSearch(start=1.0, bisections=2)
    rates = run(search, capacity=0.3)
    assert rates[:3] == pytest.approx([1.0, 0.5, 0.25])
    assert len(rates) == 5
    assert 0.25 <= search.goodput <= 0.3


def test_search_stops_at_its_bounds():
    # Nothing meets the SLO: halves down to min_rate, goodput 0.
    nothing = RateSearch(start=1.0, bisections=4, min_rate=0.25)
    assert run(nothing, capacity=0.0) == pytest.approx([1.0, 0.5, 0.25])
    assert nothing.goodput == 0
    # Everything does: doubles up to max_rate and reports it.
    everything = RateSearch(start=1.0, bisections=4, max_rate=3.0)
    assert run(everything, capacity=100.0) == pytest.approx([1.0, 2.0, 3.0])
    assert everything.goodput == 3.0


def test_search_refuses_bad_parameters():
    with pytest.raises(ValueError, match="start rate must be > 0, got 0"):
        RateSearch(start=0)
    with pytest.raises(ValueError, match="factor must be > 1"):
        RateSearch(start=1, factor=1)


def test_a_ratio_is_printed_only_where_both_modes_met_the_slo():
    assert ratio_line("(a)", 0.4, "(b)", 0.1) == "(a)/(b) 4.00"
    assert ratio_line("(a)", 0.4, "(b)", 0.0) == ("(a)/(b): no ratio, (b) met the SLO at no rate")
    assert ratio_line("(a)", 0.0, "(c)", 0.1) == ("(a)/(c): no ratio, (a) met the SLO at no rate")
    assert ratio_line("(a)", 0.0, "(c)", 0.0) == (
        "(a)/(c): no ratio, (a) and (c) met the SLO at no rate"
    )


def test_a_target_is_met_only_by_a_finite_ratio():
    assert target_verdict(0.4, 0.1, 2.0) == "met"
    assert target_verdict(0.12, 0.1, 1.3) == "NOT met"
    assert target_verdict(0.4, 0.0, 2.0) == "missed: no finite ratio"
    assert target_verdict(0.0, 0.0, 2.0) == "missed: no finite ratio"


def point(rate: float, ttfts: list[float]) -> tuple[float, list[TurnTiming]]:
    return rate, turns(ttfts)


# A mode's measured points: P90 TTFT 0.4 s at 0.1/s, 0.9 s at 0.2/s, 3 s at 0.4/s.
POINTS = [
    point(0.1, [0.3] * 9 + [5.0]),
    point(0.2, [0.9] * 10),
    point(0.4, [3.0] * 10),
]


def test_rescoring_measured_points_at_multiples_of_the_ttft_bound():
    slo = SLO(ttft_s=1.0, tpot_s=0.05)
    assert rescore(POINTS, with_ttft_scaled(slo, 0.5)) == Rescored(0.1, False)
    assert rescore(POINTS, slo) == Rescored(0.2, False)
    assert rescore(POINTS, with_ttft_scaled(slo, 2)) == Rescored(0.2, False)
    # Every point meets 4 s: the goodput is at least the highest rate the search ran.
    at_four = rescore(POINTS, with_ttft_scaled(slo, 4))
    assert at_four == Rescored(0.4, True) and at_four.describe() == ">= 0.400"
    assert rescore(POINTS, with_ttft_scaled(slo, 0.25)) == Rescored(0.0, False)
    assert with_ttft_scaled(slo, 4).tpot_s == slo.tpot_s  # the TPOT bound is kept
    assert rescore([], slo) == Rescored(0.0, False)


def test_rescoring_takes_the_highest_rate_that_met_even_above_a_miss():
    # Noise: a lower rate missed and a higher one met; goodput is the highest that met,
    # as the search itself records it.
    noisy = [point(0.1, [2.0] * 10), point(0.2, [0.5] * 10), point(0.3, [2.0] * 10)]
    assert rescore(noisy, SLO(ttft_s=1.0, tpot_s=0.05)) == Rescored(0.2, False)
