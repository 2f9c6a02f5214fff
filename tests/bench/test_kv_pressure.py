"""The KV pressure benchmark's pure parts (bench/kv_pressure.py): the plan every
configuration replays, the pools sized from it, the figures by turn and the table with its
ratios against device only. No platform is started."""

import math

from bench.kv_pressure import (
    CONFIGS,
    QUICK,
    ConfigResult,
    Setup,
    TurnRecord,
    build_plan,
    by_turn,
    conversations_for,
    format_table,
    live_pages,
    ratios,
    size_pools,
    summarise,
)


def test_the_plan_is_the_seeds_alone_with_think_time_between_turns():
    plan = build_plan(QUICK, seed=3)
    assert plan == build_plan(QUICK, seed=3)
    assert plan != build_plan(QUICK, seed=4)
    assert len(plan) == QUICK.conversations
    starts = [conversation.start_s for conversation in plan]
    assert starts == sorted(starts) and starts[0] >= 0 and starts[-1] <= QUICK.spread_s
    low, high = QUICK.think_s
    for conversation in plan:
        first, *later = conversation.turns
        assert first.think_s == 0 and first.image is not None
        assert all(turn.image is None and low <= turn.think_s <= high for turn in later)
    # The user's own notes make every history its own past the system prompt.
    assert len({conversation.turns[0].text for conversation in plan}) == len(plan)


def test_the_device_pools_hold_the_longest_turn_and_a_fraction_of_the_live_histories():
    sizes = size_pools(build_plan(QUICK, seed=0), QUICK.max_tokens, page_bytes=1 << 20)
    assert sizes.device_pages >= sizes.longest_pages
    assert sizes.pressure(3) >= 3 and math.isclose(sizes.pressure(1), 3 * sizes.pressure(3))
    # One pod runs a third of the conversations: about the same pressure on its pool.
    plan = build_plan(QUICK, seed=0)
    one = plan[: conversations_for(QUICK, 1)]
    assert len(one) == math.ceil(QUICK.conversations / 3)
    assert sizes.pressure(1, live_pages(one, QUICK.max_tokens)) >= 2.5
    assert sizes.host_bytes >= sizes.live_pages * sizes.page_bytes


def record(turn: int, ttft_s: float, prompt: int = 500, cached: int = 0, ok: bool = True):
    return TurnRecord(0, turn, ttft_s, prompt, cached, "pod", ok)


def test_figures_by_turn_and_later_turns():
    turns = [record(0, 2.0), record(1, 0.1, cached=400), record(1, 0.3, cached=300)]
    turns += [record(2, 0.2, cached=450), record(2, 0.0, ok=False)]
    table = by_turn(turns)
    assert list(table) == [0, 1, 2]
    assert table[1] == {
        "turns": 2,
        "ttft_p50_ms": 100.0,
        "ttft_p90_ms": 300.0,
        "prefill_tokens": 150.0,
    }
    summary = summarise(turns)
    assert summary["later_p50_ms"] == 200.0 and summary["later_p90_ms"] == 300.0
    assert summary["prefill_tokens"] == 500 + 100 + 200 + 50
    assert summary["later_prefill_tokens"] == 350 and summary["failed"] == 1


def config(setup: Setup, ttft_s: float, cached: int, moved_s: float | None = None):
    turns = [record(0, 1.0), record(1, ttft_s, cached=cached), record(2, ttft_s, cached=cached)]
    moved = [] if moved_s is None else [record(2, moved_s), record(2, moved_s * 3)]
    return ConfigResult(setup, 3, turns, {"device": 10, "host": 5, "miss": 1}, moved)


def test_the_table_gives_each_configuration_against_device_only_and_the_targets():
    device, host, store, rr_store, _ = CONFIGS
    results = {
        "device": config(device, 1.2, 0),
        "host": config(host, 0.6, 300, moved_s=1.0),
        "store": config(store, 0.3, 400, moved_s=0.2),
        "rr-store": config(rr_store, 0.9, 200),
    }
    summaries = {key: summarise(result.turns) for key, result in results.items()}
    assert ratios(summaries)["store"]["later_p90"] == 4.0
    assert ratios(summaries)["host"]["prefill"] == 1500 / 900
    lines = format_table(3, results)
    assert len(lines) == 1 + 4 + 1 + 3 + 2
    assert "ratio device only / host tier + store, prefix: later-turn p50 4.00, p90 4.00" in (
        "\n".join(lines)
    )
    assert lines[-2].endswith("p90 >= 3x better than device only: 4.00 (met)")
    assert "store 400 ms over 2 turns, prefilled 2000 ms over 2; ratio 5.00" in lines[-1]
    # Another pod count has no target line; a new policy is one more row.
    assert not any("target:" in line for line in format_table(1, results))
    extra = Setup("ttft", "host tier + store, estimated TTFT", "estimated-ttft", True, True)
    results["ttft"] = config(extra, 0.4, 400)
    assert any(
        line.startswith("  host tier + store, estimated TTFT") for line in format_table(3, results)
    )
