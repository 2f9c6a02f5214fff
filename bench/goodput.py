"""`bench/workload.py --goodput`: the highest offered rate each mode serves within an SLO
declared before the run.

The workload is bench/workload.py's image chat on the demo model; the offered rate is
conversation starts per second. Three modes, each on its own freshly started platform:

  (a) prefix-aware routing + embedding reuse
  (b) round-robin, no embedding reuse
  (c) round-robin + embedding reuse

1. The SLO is declared, not measured by the run: `DECLARED` below, frozen with the date and
   the machine it was measured on. `--calibrate` measures it: each mode unloaded (its own
   platform, the library warmed, `--calibration-users` conversations one after another),
   P90 TTFT over every turn and P90 TPOT; the bounds are 1.5 x the slowest mode's, rounded
   up to 100 ms / 10 ms (bench/goodput_search.py, `declared_slo`), and it prints the
   constants to write here. Every mode therefore meets the SLO unloaded, and no loaded
   result moves it. `--slo-ttft-ms` / `--slo-tpot-ms` override a bound for one run.
2. Per mode, `bench/goodput_search.py`'s search: a bracket (doubling or halving from the
   start rate: one conversation in flight at the mode's own declared unloaded pace), then
   `--bisections` points (4; 1 with `--quick`), each point at least `--point-turns` turns
   (100; 24 with `--quick`). Points run one after another on the mode's platform, warm as
   a running deployment is; every mode runs the same workloads in the same order (point k
   uses seed `--seed` + 100 + k).
3. The wall clock is capped (`--wall-cap-min`, 60; 12 with `--quick`): each mode gets an
   equal share of what is left once its platform is up; its first point always runs; a
   later point whose expected length (arrivals plus one conversation at the unloaded pace)
   would pass the mode's share is not started, and a search cut short says so. Platform
   starts and a loaded point's overrun are not foreseen, so a run may end a few minutes
   past the cap.

The workload is the plain one for every mode: uploads 30 % of attached images
(`--upload-share` changes it for every mode at once), `--turns` turns, no think time (a
turn is sent when the last answer is in).

Printed first: the SLO with where it comes from, and the workload. Then every point (rate,
turns, P90 TTFT and TPOT, the share of turns meeting the SLO, routing precision and
regret), each mode's goodput, (a)'s goodput over (b)'s and (c)'s with the issue's targets
(>= 2x and >= 1.3x), and each mode's goodput at 0.5x, 2x and 4x the TTFT bound by
re-scoring the points already run (no new runs). A ratio is printed only where both modes
met the SLO at some rate; otherwise the line names the mode that met nothing. Drawn: the
share of turns meeting the SLO against offered rate, one line per mode
(bench/out/goodput.png); every point, with its turns, is written as JSON beside it.
"""

from __future__ import annotations

import asyncio
import datetime
import json
import math
import os
import statistics
import sys
import time
from argparse import Namespace
from dataclasses import asdict, dataclass, field
from pathlib import Path

from bench.goodput_search import (
    SLO,
    RateSearch,
    TurnTiming,
    declared_slo,
    meets_slo,
    point_quantiles,
    ratio_line,
    rescore,
    share_meeting,
    target_verdict,
    with_ttft_scaled,
)
from bench.plots import cores

GOODPUT_MODES = [
    ("a", "(a) prefix + reuse", "prefix", True),
    ("b", "(b) round-robin, no reuse", "round-robin", False),
    ("c", "(c) round-robin + reuse", "round-robin", True),
]
# (a)'s goodput over the other mode's: the issue's targets.
TARGETS = [("b", 2.0), ("c", 1.3)]
# The TTFT bound's multiples the points are re-scored at, besides the bound itself.
CURVE = (0.5, 1.0, 2.0, 4.0)
QUICK = {"point_turns": 24, "bisections": 1, "wall_cap_min": 12.0, "calibration_users": 3}
FULL = {"point_turns": 100, "bisections": 4, "wall_cap_min": 60.0, "calibration_users": 6}


@dataclass(frozen=True)
class Declared:
    """The SLO `--calibrate` measured, frozen: its bounds, each mode's unloaded seconds a
    turn (its search's start rate and the cap's estimates), and when and where."""

    slo: SLO
    turn_s: dict[str, float]
    measured: str


# `python bench/workload.py --calibrate`, 2026-12-06 09:35-09:45 UTC, demo model, 6
# conversations (24 turns) a mode: P90 TTFT (a) 264 ms, (b) 3,688 ms, (c) 759 ms; P90 TPOT
# (a) 53.5 ms, (b) 53.0 ms, (c) 95.6 ms; seconds a turn (a) 0.62, (b) 2.63, (c) 1.10.
# Measured on the 2-core CPU with nothing else running for (a) and (b) (load about 1);
# two other jobs began setting up during (c) (load 2.4 at its end), which is why (c)'s TPOT
# is the slowest. Frozen: no later result moves it (issue 65). The earlier calibration
# (07:23 UTC, load 5.4-7.4) is withdrawn.
DECLARED = Declared(
    SLO(ttft_s=5.6, tpot_s=0.15),
    turn_s={"a": 0.62, "b": 2.63, "c": 1.10},
    measured="2026-12-06 09:35-09:45 UTC on the 2-core CPU, load 1.0-2.4",
)


@dataclass
class Point:
    rate: float
    met: bool
    turns: int
    failed: int
    ttft_p90_ms: float
    tpot_p90_ms: float
    share_meeting_slo: float
    routing_precision: float
    routing_regret_share: float
    wall_s: float
    timings: list[TurnTiming] = field(default_factory=list)


@dataclass
class ModeGoodput:
    key: str
    name: str
    points: list[Point] = field(default_factory=list)
    goodput: float = 0.0
    bracketed: bool = False
    capped: bool = False  # the wall-clock share ran out before the search ended


def timings(result) -> list[TurnTiming]:
    """Each turn of a workload run as the SLO reads it."""
    out = []
    for turn in result.turns:
        tpot = None
        if turn.ok and turn.completion_tokens > 1:
            tpot = (turn.total_s - turn.ttft_s) / (turn.completion_tokens - 1)
        out.append(TurnTiming(turn.ttft_s, tpot, turn.ok))
    return out


def images_for(plan, args: Namespace, seed: int, workload) -> dict[str, bytes]:
    keys = {workload.library_key(i) for i in range(args.library)}
    keys |= {key for row in plan for key in row if key is not None}
    return {key: workload.make_image(key, seed) for key in sorted(keys)}


def shape(args: Namespace, users: int, workload):
    return workload.WorkloadShape(
        users, args.turns, args.library, args.upload_share, args.later_image
    )


def regret_share(result) -> float:
    prompt = result.routed_prompt_tokens
    return sum(result.regret_tokens.values()) / prompt if prompt else math.nan


def run_point(platform, args, rate: float, index: int, warm: bool, slo: SLO, workload) -> Point:
    seed = args.seed + 100 + index
    users = math.ceil(args.point_turns / args.turns)
    plan = workload.build_plan(shape(args, users, workload), seed)
    images = images_for(plan, args, seed, workload)
    run_args = Namespace(**{**vars(args), "rate": rate, "warm_up": warm})
    result = asyncio.run(workload.drive(platform, plan, images, run_args, "point", seed))
    turns = timings(result)
    ttft, tpot = point_quantiles(turns, slo.quantile)
    return Point(
        rate=rate,
        met=meets_slo(turns, slo),
        turns=len(turns),
        failed=sum(not t.ok for t in turns),
        ttft_p90_ms=ttft * 1e3,
        tpot_p90_ms=tpot * 1e3,
        share_meeting_slo=share_meeting(turns, slo),
        routing_precision=(
            result.predicted_within_page / result.predicted if result.predicted else math.nan
        ),
        routing_regret_share=regret_share(result),
        wall_s=result.wall_s,
        timings=turns,
    )


def expected_s(args, rate: float, turn_s: float) -> float:
    """About how long a point at `rate` takes: its arrivals, then one conversation's turns
    at the unloaded pace (a loaded point takes longer; the cap is a guide, not a bound)."""
    users = math.ceil(args.point_turns / args.turns)
    return (users - 1) / rate + args.turns * turn_s


def run_mode(mode, args, slo: SLO, cap_end: float, modes_left: int, workload) -> ModeGoodput:
    """One mode's search on its own platform. Its share of the cap is what is left once
    its platform is up over the modes left; its first point always runs."""
    key, name, router, reuse = mode
    found = ModeGoodput(key, name)
    started = time.perf_counter()
    turn_s = DECLARED.turn_s.get(key, 1.0)
    start_rate = args.start_rate or 1.0 / (args.turns * turn_s)
    with workload.Platform(workload.up_config(args, router, reuse)) as platform:
        print(f"[{name}] platform up in {time.perf_counter() - started:.0f} s", file=sys.stderr)
        now = time.perf_counter()
        deadline = now + max(0.0, cap_end - now) / modes_left
        search = RateSearch(start=start_rate, bisections=args.bisections)
        print(f"[{name}] start rate {start_rate:.3f}/s", flush=True)
        warm, index = args.warm_up, 0
        while (rate := search.next_rate()) is not None:
            late = time.perf_counter() + expected_s(args, rate, turn_s) > deadline
            if found.points and late:
                found.capped = True
                break
            point = run_point(platform, args, rate, index, warm, slo, workload)
            warm, index = False, index + 1
            search.record(rate, point.met)
            found.points.append(point)
            print(
                f"[{name}] rate {rate:.3f}/s: {point.turns} turns ({point.failed} failed), "
                f"P90 TTFT {point.ttft_p90_ms:.0f} ms, P90 TPOT {point.tpot_p90_ms:.1f} ms, "
                f"{point.share_meeting_slo:.0%} within SLO, routing precision "
                f"{point.routing_precision:.2f}, regret {point.routing_regret_share:.1%} "
                f"-> {'met' if point.met else 'missed'}",
                flush=True,
            )
    found.goodput, found.bracketed = search.goodput, search.bracketed
    return found


def run_slo(args) -> tuple[SLO, str]:
    """The run's SLO and where it comes from: the declared one, a bound overridden."""
    slo, source = DECLARED.slo, f"declared, measured {DECLARED.measured}"
    if args.slo_ttft_ms or args.slo_tpot_ms:
        slo = SLO(
            args.slo_ttft_ms / 1e3 if args.slo_ttft_ms else slo.ttft_s,
            args.slo_tpot_ms / 1e3 if args.slo_tpot_ms else slo.tpot_s,
        )
        flags = (("--slo-ttft-ms", args.slo_ttft_ms), ("--slo-tpot-ms", args.slo_tpot_ms))
        given = [flag for flag, value in flags if value]
        source = f"{' and '.join(given)} over the declared SLO ({DECLARED.measured})"
    return slo, source


def describe_workload(args) -> str:
    return (
        f"workload: uploads {args.upload_share:.0%} of attached images (every mode), "
        f"{args.turns} turns a conversation, think time 0 s (a turn follows the last answer), "
        f"library {args.library} images, later-turn image chance {args.later_image:.0%}, "
        f"answers of {args.max_tokens} tokens, {args.pods} LLM pods"
    )


def report(found: dict[str, ModeGoodput], slo: SLO, args, elapsed_s: float) -> None:
    print(f"SLO: {slo.describe()}")
    for mode in found.values():
        notes = [] if mode.bracketed else ["not bracketed: goodput at the search's bound"]
        if mode.capped:
            notes.append("search cut short by the wall-clock cap")
        print(
            f"goodput {mode.name}: {mode.goodput:.3f} conversations/s "
            f"({len(mode.points)} points)" + (f" [{'; '.join(notes)}]" if notes else "")
        )
    a = found.get("a")
    for key, target in TARGETS:
        if a is None or key not in found:
            continue
        line = ratio_line("(a)", a.goodput, f"({key})", found[key].goodput)
        verdict = target_verdict(a.goodput, found[key].goodput, target)
        print(f"goodput {line} (target >= {target:g}: {verdict})")
    print_curve(found, slo)
    print(f"runtime of this run: {elapsed_s:.0f} s (cap {args.wall_cap_min:g} min)")


def print_curve(found: dict[str, ModeGoodput], slo: SLO) -> None:
    """Each mode's goodput at multiples of the TTFT bound, from its measured points."""
    for factor in CURVE:
        bound = with_ttft_scaled(slo, factor)
        scored = {
            key: rescore([(p.rate, p.timings) for p in mode.points], bound)
            for key, mode in found.items()
        }
        parts = [f"({key}) {value.describe()}" for key, value in scored.items()]
        a = scored.get("a")
        for key, _ in TARGETS:
            if a is not None and key in scored:
                parts.append(ratio_line("(a)", a.goodput, f"({key})", scored[key].goodput))
        at = f"{factor:g}x the TTFT bound ({bound.ttft_s * 1e3:.0f} ms)"
        print(f"goodput re-scored at {at}: " + "; ".join(parts))


def plot(found: dict[str, ModeGoodput], slo: SLO, path: Path, model) -> None:
    """Share of turns meeting the SLO against offered rate, one line per mode."""
    from bench.plots import figure, save, stamp

    fig, axes = figure(1, 1, size=(8, 4.8))
    axis = axes[0][0]
    for mode in found.values():
        points = sorted(mode.points, key=lambda p: p.rate)
        if points:
            axis.plot(
                [p.rate for p in points],
                [p.share_meeting_slo for p in points],
                marker="o",
                label=f"{mode.name}: goodput {mode.goodput:.3f}/s",
            )
    axis.axhline(slo.quantile / 100, color="grey", linestyle="--", linewidth=0.8)
    axis.set_xlabel("offered rate (conversation starts per second)")
    axis.set_ylabel("share of turns within the SLO")
    axis.set_ylim(0, 1.02)
    axis.set_title(f"Goodput: {slo.describe()}", fontsize=9)
    axis.grid(True, alpha=0.3)
    axis.legend(fontsize=7)
    stamp(fig, model)
    save(fig, path)


def fill_defaults(args) -> None:
    for key, value in (QUICK if args.quick else FULL).items():
        if getattr(args, key) is None:
            setattr(args, key, value)


def run_goodput(args, workload) -> None:
    """The whole goodput run (see the module docstring); `workload` is bench.workload."""
    fill_defaults(args)
    slo, source = run_slo(args)
    print(f"SLO: {slo.describe()} ({source})", flush=True)
    print(describe_workload(args), flush=True)
    if not (slo.ttft_s > 0 and slo.tpot_s > 0):
        raise SystemExit("no SLO declared yet: run --calibrate, or give both --slo-*-ms")
    started = time.perf_counter()
    cap_end = started + args.wall_cap_min * 60
    only = [mode for mode in GOODPUT_MODES if mode[0] in args.only.split(",")]
    found: dict[str, ModeGoodput] = {}
    for position, mode in enumerate(only):
        found[mode[0]] = run_mode(mode, args, slo, cap_end, len(only) - position, workload)
    report(found, slo, args, time.perf_counter() - started)
    plot(found, slo, args.goodput_png, args.model)
    document = {
        "args": {key: str(value) for key, value in vars(args).items()},
        "slo": asdict(slo),
        "slo_source": source,
        "modes": {key: asdict(mode) for key, mode in found.items()},
    }
    args.goodput_json.parent.mkdir(parents=True, exist_ok=True)
    args.goodput_json.write_text(json.dumps(document, indent=1))
    print(f"wrote {args.goodput_png} and {args.goodput_json}")


def calibrate_mode(mode, args, workload) -> dict:
    """One mode unloaded on its own platform: conversations one after another (the library
    warmed first); P90 TTFT over every turn, P90 TPOT, mean seconds a turn."""
    _, name, router, reuse = mode
    plan = workload.build_plan(shape(args, args.calibration_users, workload), args.seed + 99)
    images = images_for(plan, args, args.seed + 99, workload)
    run_args = Namespace(**{**vars(args), "rate": 0.0})
    with workload.Platform(workload.up_config(args, router, reuse)) as platform:
        result = asyncio.run(workload.drive(platform, plan, images, run_args, name, 0))
    turns = timings(result)
    ok = [t for t in result.turns if t.ok]
    if not ok or len(ok) < len(turns):
        raise RuntimeError(f"{name}: {len(turns) - len(ok)} of {len(turns)} turns failed unloaded")
    ttft, tpot = point_quantiles(turns, 90)
    turn_s = statistics.fmean(t.total_s for t in ok)
    return {"ttft_p90_s": ttft, "tpot_p90_s": tpot, "turn_s": turn_s, "turns": len(turns)}


def run_calibration(args, workload) -> None:
    """`--calibrate`: measure each mode unloaded and print the declared SLO's constants."""
    fill_defaults(args)
    print(describe_workload(args), flush=True)
    print(f"calibration: {args.calibration_users} conversations one at a time per mode", flush=True)
    only = [mode for mode in GOODPUT_MODES if mode[0] in args.only.split(",")]
    measured = {}
    for mode in only:
        measured[mode[0]] = calibrate_mode(mode, args, workload)
        one = measured[mode[0]]
        print(
            f"{mode[1]}: {one['turns']} turns, P90 TTFT {one['ttft_p90_s'] * 1e3:.0f} ms, "
            f"P90 TPOT {one['tpot_p90_s'] * 1e3:.1f} ms, {one['turn_s']:.2f} s a turn",
            flush=True,
        )
    slo = declared_slo(
        {key: one["ttft_p90_s"] for key, one in measured.items()},
        {key: one["tpot_p90_s"] for key, one in measured.items()},
    )
    turn_s = {key: round(one["turn_s"], 2) for key, one in measured.items()}
    load = ", ".join(f"{value:.1f}" for value in os.getloadavg())
    where = f"{datetime.date.today()}, {cores()}-core CPU, load {load} at the end"
    print(f"declared SLO: {slo.describe()} ({where})")
    print("bench/goodput.py's DECLARED, to write there:")
    print(f"    SLO(ttft_s={slo.ttft_s:g}, tpot_s={slo.tpot_s:g}), turn_s={turn_s}")
