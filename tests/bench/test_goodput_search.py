"""Goodput's pure logic (bench/goodput_search.py): the SLO from a calibration, whether a
point meets it, and the bracket-then-bisect search over offered rates."""

import math

import pytest

from bench.goodput_search import (
    SLO,
    RateSearch,
    TurnTiming,
    meets_slo,
    point_quantiles,
    quantile,
    ratio_verdict,
    share_meeting,
    slo_from_calibration,
)


def test_slo_is_3x_ttft_and_2x_tpot_of_the_calibration_unless_told():
    slo = slo_from_calibration(0.5, 0.02)
    assert math.isclose(slo.ttft_s, 1.5) and math.isclose(slo.tpot_s, 0.04)
    custom = slo_from_calibration(0.5, 0.02, ttft_factor=5, tpot_factor=1.5)
    assert math.isclose(custom.ttft_s, 2.5) and math.isclose(custom.tpot_s, 0.03)
    assert "P90 TTFT <= 1500 ms" in slo.describe()


@pytest.mark.parametrize("bad", [0.0, -1.0, float("nan"), float("inf")])
def test_a_calibration_without_a_figure_is_refused(bad):
    with pytest.raises(ValueError, match="ttft_p50_s must be a positive"):
        slo_from_calibration(bad, 0.02)


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


def test_ratios_over_nothing_are_said_plainly():
    assert ratio_verdict(0.4, 0.1, 2.0) == "4.00 (target >= 2: met)"
    assert ratio_verdict(0.12, 0.1, 1.3) == "1.20 (target >= 1.3: NOT met)"
    assert ratio_verdict(0.0, 0.0, 2.0).startswith("undefined")
    assert ratio_verdict(0.1, 0.0, 2.0).startswith("unbounded")
