"""`bench/workload.py --goodput`: the highest offered rate each mode serves within an SLO.

The workload is bench/workload.py's image chat on the demo model; the offered rate is
conversation starts per second. Three modes, each on its own freshly started platform:

  (a) prefix-aware routing + embedding reuse
  (b) round-robin, no embedding reuse
  (c) round-robin + embedding reuse

1. Calibration, on (a)'s platform before its search: conversations one after another (no
   queueing) give the unloaded first-turn TTFT p50 and TPOT p50. The SLO is P90 TTFT <=
   3x and P90 TPOT <= 2x those (`--slo-ttft-ms` / `--slo-tpot-ms` set them instead); both
   are printed with the calibration.
2. Per mode, `bench/goodput_search.py`'s search: a bracket (doubling or halving from the
   start rate), then `--bisections` points (4; 1 with `--quick`), each point at least
   `--point-turns` turns (100; 24 with `--quick`). Points run one after another on the
   mode's platform, warm as a running deployment is; every mode runs the same workloads in
   the same order (point k uses seed `--seed` + 100 + k).
3. The wall clock is capped (`--wall-cap-min`, 60; 12 with `--quick`): each mode gets an
   equal share of what is left once its platform is up (after the calibration, for (a));
   its first point always runs; a later point whose expected length (arrivals
   plus one conversation at the calibration's pace) would pass the mode's share is not
   started, and a search cut short says so. Platform starts and a loaded point's overrun
   are not foreseen, so a run may end a few minutes past the cap.

The workload's uploads default to 15 % of attached images (`GOODPUT_UPLOAD_SHARE`; the
plain workload's 30 %, `--upload-share` sets it). An upload is a tower call of ~3.8 s on
this CPU (17x a first turn's TTFT), and at 30 % the plan makes exactly a tenth of the turns
uploads: the P90 then sits on the edge between a cached turn and a tower call, and no rate,
not even one conversation at a time, meets 3x the p50 (the first full run found this: at
0.056/s, nothing queued, P90 TTFT 814 ms against the SLO's 644). At 15 % about one turn in
twenty is an upload, so the P90 measures queueing, and the uploads still load the encoder.
The calibration also prints its own P90s over every turn, with a warning when the unloaded
platform already misses the SLO.

Printed: the calibration and SLO, every point (rate, turns, P90 TTFT and TPOT, the share of
turns meeting the SLO, routing precision), each mode's goodput, and (a)'s goodput over (b)'s
and (c)'s with the issue's targets (>= 2x and >= 1.3x). Drawn: the share of turns meeting
the SLO against offered rate, one line per mode (bench/out/goodput.png); every point is
written as JSON beside it.
"""

from __future__ import annotations

import asyncio
import json
import math
import statistics
import sys
import time
from argparse import Namespace
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from bench.goodput_search import (
    SLO,
    RateSearch,
    TurnTiming,
    meets_slo,
    point_quantiles,
    ratio_verdict,
    share_meeting,
    slo_from_calibration,
)

GOODPUT_MODES = [
    ("a", "(a) prefix + reuse", "prefix", True),
    ("b", "(b) round-robin, no reuse", "round-robin", False),
    ("c", "(c) round-robin + reuse", "round-robin", True),
]
# (a)'s goodput over the other mode's: the issue's targets.
TARGETS = [("b", 2.0), ("c", 1.3)]
QUICK = {"point_turns": 24, "bisections": 1, "wall_cap_min": 12.0, "calibration_users": 3}
FULL = {"point_turns": 100, "bisections": 4, "wall_cap_min": 60.0, "calibration_users": 6}
# Uploads, as a share of attached images, when --upload-share is not given (see above).
GOODPUT_UPLOAD_SHARE = 0.15


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
    wall_s: float


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


def calibrate(platform, args: Namespace, workload) -> tuple[float, float, float, list]:
    """(first-turn TTFT p50, TPOT p50, mean turn seconds, every turn's timing) of
    conversations run one after another on an unloaded platform (the library warmed
    first)."""
    shape = workload.WorkloadShape(
        args.calibration_users, args.turns, args.library, args.upload_share, args.later_image
    )
    plan = workload.build_plan(shape, args.seed + 99)
    images = images_for(plan, args, args.seed + 99, workload)
    run_args = Namespace(**{**vars(args), "rate": 0.0, "warm_up": args.warm_up})
    result = asyncio.run(workload.drive(platform, plan, images, run_args, "calibration", 0))
    ok = [t for t in result.turns if t.ok]
    first = [t.ttft_s for t in ok if t.turn == 0]
    turns = timings(result)
    tpots = [t.tpot_s for t in turns if t.ok and t.tpot_s is not None]
    if not first or not tpots:
        raise RuntimeError(f"calibration answered no usable turn ({len(result.turns)} sent)")
    return (
        statistics.median(first),
        statistics.median(tpots),
        statistics.fmean(t.total_s for t in ok),
        turns,
    )


def images_for(plan, args: Namespace, seed: int, workload) -> dict[str, bytes]:
    keys = {workload.library_key(i) for i in range(args.library)}
    keys |= {key for row in plan for key in row if key is not None}
    return {key: workload.make_image(key, seed) for key in sorted(keys)}


def run_point(platform, args, rate: float, index: int, warm: bool, slo: SLO, workload) -> Point:
    users = math.ceil(args.point_turns / args.turns)
    shape = workload.WorkloadShape(
        users, args.turns, args.library, args.upload_share, args.later_image
    )
    seed = args.seed + 100 + index
    plan = workload.build_plan(shape, seed)
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
        wall_s=result.wall_s,
    )


def expected_s(args, rate: float, state: dict) -> float:
    """About how long a point at `rate` takes: its arrivals, then one conversation's turns
    at the unloaded pace (a loaded point takes longer; the cap is a guide, not a bound)."""
    users = math.ceil(args.point_turns / args.turns)
    return (users - 1) / rate + args.turns * state.get("turn_s", 0.0)


def run_mode(mode, args, state: dict, cap_end: float, modes_left: int, workload) -> ModeGoodput:
    """One mode's search on its own platform; calibrates first when no SLO is set yet. The
    mode's share of the cap is what is left once its platform is up (and calibrated) over
    the modes left; its first point always runs, so every mode has one."""
    key, name, router, reuse = mode
    found = ModeGoodput(key, name)
    config = workload.up_config(args, router, reuse)
    started = time.perf_counter()
    with workload.Platform(config) as platform:
        print(f"[{name}] platform up in {time.perf_counter() - started:.0f} s", file=sys.stderr)
        warm = args.warm_up
        if state.get("slo") is None:
            ttft_p50, tpot_p50, turn_s, unloaded = calibrate(platform, args, workload)
            state["calibration"] = {"first_turn_ttft_p50_s": ttft_p50, "tpot_p50_s": tpot_p50}
            slo = slo_from_calibration(ttft_p50, tpot_p50)
            slo = SLO(
                args.slo_ttft_ms / 1e3 if args.slo_ttft_ms else slo.ttft_s,
                args.slo_tpot_ms / 1e3 if args.slo_tpot_ms else slo.tpot_s,
            )
            state["slo"] = slo
            state["start_rate"] = args.start_rate or 1.0 / (args.turns * turn_s)
            state["turn_s"] = turn_s
            warm = False  # the calibration warmed the library
            print(
                f"calibration (unloaded, one conversation at a time): first-turn TTFT p50 "
                f"{ttft_p50 * 1e3:.0f} ms, TPOT p50 {tpot_p50 * 1e3:.1f} ms, turn "
                f"{turn_s:.2f} s; SLO: {slo.describe()}; start rate "
                f"{state['start_rate']:.3f}/s",
                flush=True,
            )
            ttft_p90, tpot_p90 = point_quantiles(unloaded, slo.quantile)
            print(
                f"calibration over all {len(unloaded)} turns: P90 TTFT {ttft_p90 * 1e3:.0f} ms, "
                f"P90 TPOT {tpot_p90 * 1e3:.1f} ms, {share_meeting(unloaded, slo):.0%} within "
                "the SLO"
                + ("" if meets_slo(unloaded, slo) else
                   "; WARNING: the unloaded platform misses the SLO, so no rate may meet it"),
                flush=True,
            )  # fmt: skip
        slo = state["slo"]
        now = time.perf_counter()
        deadline = now + max(0.0, cap_end - now) / modes_left
        search = RateSearch(start=state["start_rate"], bisections=args.bisections)
        index = 0
        while (rate := search.next_rate()) is not None:
            late = time.perf_counter() + expected_s(args, rate, state) > deadline
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
                f"{point.routing_precision:.2f} -> {'met' if point.met else 'missed'}",
                flush=True,
            )
    found.goodput, found.bracketed = search.goodput, search.bracketed
    return found


def report(found: dict[str, ModeGoodput], state: dict, args, elapsed_s: float) -> None:
    slo = state["slo"]
    print(f"SLO: {slo.describe()} (calibration {state['calibration']})")
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
        verdict = ratio_verdict(a.goodput, found[key].goodput, target)
        print(f"goodput ratio (a)/({key}): {verdict}")
    print(f"runtime of this run: {elapsed_s:.0f} s (cap {args.wall_cap_min:g} min)")


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


def run_goodput(args, workload) -> None:
    """The whole goodput run (see the module docstring); `workload` is bench.workload."""
    for key, value in (QUICK if args.quick else FULL).items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    started = time.perf_counter()
    cap_s = args.wall_cap_min * 60
    only = [mode for mode in GOODPUT_MODES if mode[0] in args.only.split(",")]
    state: dict = {"slo": None}
    if args.slo_ttft_ms and args.slo_tpot_ms and args.start_rate:
        state.update(slo=SLO(args.slo_ttft_ms / 1e3, args.slo_tpot_ms / 1e3), calibration={})
        state["start_rate"] = args.start_rate
    found: dict[str, ModeGoodput] = {}
    for position, mode in enumerate(only):
        found[mode[0]] = run_mode(
            mode, args, state, started + cap_s, len(only) - position, workload
        )
    report(found, state, args, time.perf_counter() - started)
    plot(found, state["slo"], args.goodput_png, args.model)
    document = {
        "args": {key: str(value) for key, value in vars(args).items()},
        "slo": asdict(state["slo"]),
        "calibration": state["calibration"],
        "modes": {key: asdict(replace(mode)) for key, mode in found.items()},
    }
    args.goodput_json.parent.mkdir(parents=True, exist_ok=True)
    args.goodput_json.write_text(json.dumps(document, indent=1))
    print(f"wrote {args.goodput_png} and {args.goodput_json}")
