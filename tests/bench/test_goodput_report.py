"""What `bench/workload.py --goodput` prints from measured points (bench/goodput.py): the
SLO and where it comes from, the headline ratios only where both modes met the SLO, and
each mode's goodput re-scored at multiples of the TTFT bound. No platform is started."""

from argparse import Namespace

from bench.goodput import DECLARED, ModeGoodput, Point, report, run_slo
from bench.goodput_search import SLO, TurnTiming

SLO_1S = SLO(ttft_s=1.0, tpot_s=0.05)


def measured(rate: float, ttft_s: float) -> Point:
    timings = [TurnTiming(ttft_s, 0.01)] * 10
    met = ttft_s <= SLO_1S.ttft_s
    return Point(rate, met, 10, 0, ttft_s * 1e3, 10.0, float(met), 1.0, 0.0, 60.0, timings)


def mode(key: str, name: str, points: list[Point]) -> ModeGoodput:
    goodput = max((p.rate for p in points if p.met), default=0.0)
    return ModeGoodput(key, name, points, goodput, bracketed=True)


def test_the_report_names_the_mode_that_met_nothing_and_draws_the_curve(capsys):
    found = {
        "a": mode("a", "(a) prefix + reuse", [measured(0.2, 0.4), measured(0.4, 1.5)]),
        "b": mode("b", "(b) round-robin, no reuse", [measured(0.1, 3.0), measured(0.05, 1.8)]),
        "c": mode("c", "(c) round-robin + reuse", [measured(0.2, 0.8), measured(0.4, 2.5)]),
    }
    report(found, SLO_1S, Namespace(wall_cap_min=60.0), elapsed_s=10.0)
    lines = capsys.readouterr().out.splitlines()
    assert "goodput (a)/(b): no ratio, (b) met the SLO at no rate" in "\n".join(lines)
    assert "goodput (a)/(c) 1.00 (target >= 1.3: NOT met)" in lines
    curve = {line.split(":")[0]: line for line in lines if line.startswith("goodput re-scored")}
    assert len(curve) == 4
    half = curve["goodput re-scored at 0.5x the TTFT bound (500 ms)"]
    assert "(a) 0.200; (b) 0.000; (c) 0.000" in half
    assert "(a)/(c): no ratio, (c) met the SLO at no rate" in half
    # At 2 s (b) meets at 0.05/s and (c) at both its rates (the highest it ran: at least).
    double = curve["goodput re-scored at 2x the TTFT bound (2000 ms)"]
    assert "(a) >= 0.400; (b) 0.050; (c) 0.200" in double
    assert "(a)/(b) 8.00" in double and "(a)/(c) 2.00" in double
    quadruple = curve["goodput re-scored at 4x the TTFT bound (4000 ms)"]
    assert "(b) >= 0.100" in quadruple and "(c) >= 0.400" in quadruple


def test_the_slo_is_the_declared_one_unless_a_bound_is_given():
    neither = Namespace(slo_ttft_ms=None, slo_tpot_ms=None)
    slo, source = run_slo(neither)
    assert slo == DECLARED.slo and source.startswith("declared")
    slo, source = run_slo(Namespace(slo_ttft_ms=2500.0, slo_tpot_ms=None))
    assert slo == SLO(2.5, DECLARED.slo.tpot_s)
    assert source.startswith("--slo-ttft-ms over the declared SLO")
