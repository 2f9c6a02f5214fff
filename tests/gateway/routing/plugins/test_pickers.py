"""Pickers `max-score`, `round-robin`, `random`."""

from collections import Counter

from gateway.routing.plugins import create_plugin
from gateway.routing.pods import Pod

PODS = [Pod("a"), Pod("b"), Pod("c")]


def test_max_score_picks_the_best_and_rotates_ties():
    picker = create_plugin("max-score")
    assert picker.pick(PODS, [0.1, 0.9, 0.3]).address == "b"
    tied = {picker.pick(PODS, [1.0, 1.0, 0.0]).address for _ in range(4)}
    assert tied == {"a", "b"}


def test_round_robin_cycles_in_address_order_ignoring_scores():
    picker = create_plugin("round-robin")
    picks = [picker.pick(list(reversed(PODS)), [0, 0, 9]).address for _ in range(6)]
    assert picks == ["a", "b", "c", "a", "b", "c"]


def test_random_follows_the_scores():
    picker = create_plugin("random", {"seed": 1})
    counts = Counter(picker.pick(PODS, [0.0, 1.0, 3.0]).address for _ in range(400))
    assert counts["a"] == 0 and counts["c"] > counts["b"] > 0
    assert {picker.pick(PODS, [0, 0, 0]).address for _ in range(50)} == {"a", "b", "c"}
