"""Table tests of the pure scaling policy `desired_replicas`."""

from __future__ import annotations

import kopf
import pytest

from operators.policy import (
    Decision,
    EncoderLoad,
    History,
    LLMLoad,
    Loads,
    PoolLoads,
    desired_replicas,
)
from operators.spec import parse_spec

IDLE_ENCODER = EncoderLoad(queued_images=0, queued_vision_tokens=0, busy_ratio=0.1)


def make_spec(**overrides):
    raw = {
        "llm": {
            "deployment": "llm",
            "selector": {"matchLabels": {"c": "llm"}},
            "minReplicas": 1,
            "maxReplicas": 10,
            "targets": {"kvUtilisation": 0.5, "requestsWaiting": 4, "pendingPrefillTokens": 1000},
        },
        "encoder": {
            "deployment": "enc",
            "selector": {"matchLabels": {"c": "enc"}},
            "minReplicas": 1,
            "maxReplicas": 6,
            "targets": {"queuedVisionTokens": 2000, "busyRatio": 0.8},
        },
        "tolerance": 0.1,
        "scaleUp": {"stabilisationSeconds": 0, "maxStep": 4},
        "scaleDown": {"stabilisationSeconds": 300, "maxStep": 2},
    }
    for key, value in overrides.items():
        raw[key] = value
    return parse_spec(raw)


def llm(kv=0.5, waiting=0.0, pending=0.0) -> LLMLoad:
    return LLMLoad(kv_utilisation=kv, requests_waiting=waiting, pending_prefill_tokens=pending)


def decide(llm_pods, current, spec=None, history=None, now=0.0, failed=0, encoder=None):
    encoder = encoder or PoolLoads(current=1, pods=(IDLE_ENCODER,))
    loads = Loads(llm=PoolLoads(current, tuple(llm_pods), failed), encoder=encoder, now=now)
    return desired_replicas(loads, spec or make_spec(), history or History())


def follow(spec, series, current, step_s=15.0) -> list[int]:
    """Run the policy over a series of per-pod LLM loads, the Deployment following each
    decision at once; return the replica count after each round."""
    history, sizes = History(), []
    for i, per_pod in enumerate(series):
        decision = decide([per_pod] * current, current, spec, history, now=i * step_s)
        history, current = decision.history, decision.llm.desired
        sizes.append(current)
    return sizes


def direction_changes(sizes: list[int]) -> list[int]:
    """Indexes where the replica count turned from rising to falling or back."""
    changes, last = [], 0
    for i in range(1, len(sizes)):
        step = (sizes[i] > sizes[i - 1]) - (sizes[i] < sizes[i - 1])
        if step and last and step != last:
            changes.append(i)
        last = step or last
    return changes


@pytest.mark.parametrize(
    ("case", "pods", "current", "desired", "reason", "limited"),
    [
        ("steady at target", [llm(0.5)] * 3, 3, 3, "WithinTolerance", None),
        ("inside the tolerance band", [llm(0.54)] * 3, 3, 3, "WithinTolerance", None),
        ("step up on KV", [llm(0.9)] * 2, 2, 4, "ScaleUp", None),
        ("queue drives when KV is fine", [llm(0.5, waiting=12)] * 2, 2, 6, "ScaleUp", None),
        ("burst capped by max step", [llm(1.0, waiting=40)], 1, 5, "ScaleUp", "MaxStep"),
        ("burst capped by max", [llm(1.0, waiting=40)] * 8, 8, 10, "ScaleUp", "MaxReplicas"),
        ("idle held by the down window", [llm(0.0)] * 4, 4, 4, "Stabilising", None),
        ("pending prefill drives", [llm(0.3, pending=2500)] * 2, 2, 5, "ScaleUp", None),
    ],
)
def test_single_round(case, pods, current, desired, reason, limited):
    decision = decide(pods, current).llm
    assert (decision.desired, decision.reason, decision.limited) == (desired, reason, limited), case
    assert decision.active


def test_scale_down_waits_for_the_window_then_moves_by_max_step():
    spec = make_spec()
    sizes = follow(spec, [llm(0.1)] * 50, current=8)  # 15 s rounds
    # Nothing happens while the first (high) recommendation is still inside the 300 s window.
    assert sizes[:20] == [8] * 20
    # Then down by at most 2 per round, to the minimum.
    assert sizes[20] == 6
    assert min(sizes) == 1
    assert all(a - b <= 2 for a, b in zip(sizes, sizes[1:], strict=False))


def test_slow_decay_steps_down_gradually_and_never_up():
    spec = make_spec()
    # Load per pool falls linearly from 4.0 KV-pod units to 0.4 over 40 minutes, then stays.
    totals = [4.0 - 3.6 * i / 160 for i in range(160)] + [0.4] * 25
    history, current, sizes = History(), 8, []
    for i, total in enumerate(totals):
        decision = decide([llm(total / current)] * current, current, spec, history, now=i * 15.0)
        history, current = decision.history, decision.llm.desired
        sizes.append(current)
    assert sizes[-1] == 1
    assert all(b <= a for a, b in zip(sizes, sizes[1:], strict=False)), sizes


def test_flapping_input_turns_at_most_once_per_window():
    """Load that alternates every round between twice and half the target."""
    spec = make_spec()
    series = [llm(1.0) if i % 2 == 0 else llm(0.25) for i in range(80)]
    sizes = follow(spec, series, current=2)
    changes = direction_changes(sizes)
    window_rounds = 300 / 15
    assert all(b - a >= window_rounds for a, b in zip(changes, changes[1:], strict=False)), sizes
    # It rose (fast up) and then held: high recommendations keep the down window busy.
    assert max(sizes) > 2
    assert changes == []


def test_an_unread_pod_counts_as_average_not_idle():
    # Two pods answer at KV 0.9; a third did not answer. As idle: 1.8/0.5 -> 4 pods.
    decision = decide([llm(0.9)] * 2, current=3, failed=1).llm
    assert decision.desired == 6  # 0.9 * 3 / 0.5 = 5.4 -> 6
    assert "(+1 unread)" in decision.message


def test_metric_gaps_never_scale_down():
    history = History(llm=((-400.0, 1),))
    decision = decide([llm(0.05)], current=4, failed=3, history=history).llm
    assert decision.desired == 4
    assert decision.reason == "MetricGaps"


def test_no_metrics_holds_and_is_not_active():
    decision = decide([], current=3, failed=3)
    assert decision.llm.desired == 3
    assert decision.llm.reason == "NoMetrics"
    assert not decision.llm.active
    assert decision.history.llm == ()  # nothing recorded without data


def test_no_metrics_still_respects_min_and_max():
    spec = make_spec()
    assert decide([], current=0, failed=1, spec=spec).llm.desired == 1
    assert decide([], current=15, failed=1, spec=spec).llm.desired == 10


def test_min_clamp_when_idle_after_the_window():
    history = History(llm=tuple((float(t), 1) for t in range(-300, 0, 15)))
    decision = decide([llm(0.0)] * 2, current=2, history=history).llm
    assert (decision.desired, decision.limited) == (1, None)
    decision = decide([llm(0.0)] * 2, current=2, history=history, spec=_min(2)).llm
    assert (decision.desired, decision.limited) == (2, "MinReplicas")


def _min(low: int):
    raw_llm = {
        "deployment": "llm",
        "selector": {"matchLabels": {"c": "llm"}},
        "minReplicas": low,
        "maxReplicas": 10,
        "targets": {"kvUtilisation": 0.5},
    }
    return make_spec(llm=raw_llm)


def test_below_min_is_raised_to_min():
    decision = decide([llm(0.0)], current=1, spec=_min(3)).llm
    assert (decision.desired, decision.limited) == (3, "MinReplicas")


def test_vision_backlog_raises_the_llm_ahead_of_kv_pressure():
    backlog = PoolLoads(
        current=2, pods=(EncoderLoad(10, queued_vision_tokens=2000, busy_ratio=1.0),) * 2
    )
    coupled = decide([llm(0.5)] * 2, current=2, encoder=backlog)
    # 4000 queued vision tokens -> 4000 prefill tokens about to arrive / 1000 per pod -> 4.
    assert coupled.llm.desired == 4
    assert "pending_prefill_tokens" in coupled.llm.message
    # The encoder grows on its own backlog too: 4000 / 2000 = 2 ... busy 2.0 / 0.8 -> 3.
    assert coupled.encoder.desired == 3
    uncoupled = decide(
        [llm(0.5)] * 2,
        current=2,
        encoder=backlog,
        spec=make_spec(coupling={"prefillTokensPerVisionToken": 0}),
    )
    assert uncoupled.llm.desired == 2


def test_up_window_needs_agreement_for_its_whole_length():
    spec = make_spec(scaleUp={"stabilisationSeconds": 60, "maxStep": 4})
    history = History()
    sizes = []
    current = 2
    for i in range(6):
        decision: Decision = decide([llm(1.0)] * current, current, spec, history, now=i * 15.0)
        history, current = decision.history, decision.llm.desired
        sizes.append(current)
    # The first round alone is the whole window (recommendation 4 everywhere in it): up at once.
    assert sizes[0] == 4
    spiky = History(llm=((-30.0, 2), (-15.0, 2)))
    held = decide([llm(1.0)] * 2, 2, spec, spiky, now=0.0).llm
    assert (held.desired, held.reason) == (2, "Stabilising")


def test_pure_same_inputs_same_output_and_history_untouched():
    history = History(llm=((0.0, 3),))
    first = decide([llm(0.9)] * 3, 3, history=history, now=15.0)
    second = decide([llm(0.9)] * 3, 3, history=history, now=15.0)
    assert first == second
    assert history == History(llm=((0.0, 3),))
    assert first.history.llm[-1] == (15.0, first.llm.recommended)


def test_history_keeps_the_longest_window_and_one_round_before_it():
    history = History(llm=((-1000.0, 9), (-400.0, 5), (-100.0, 3)))
    decision = decide([llm(0.5)] * 3, 3, history=history, now=0.0)
    assert decision.history.llm == ((-400.0, 5), (-100.0, 3), (0.0, 3))


def test_no_scale_down_until_a_whole_window_is_seen():
    """After an operator restart the history is empty: idle pods do not shrink the pool
    before 300 s of recommendations exist, even at irregular round times."""
    spec, history, current = make_spec(), History(), 5
    for now in (0.0, 140.0, 290.0):
        decision = decide([llm(0.0)] * current, current, spec, history, now=now)
        history = decision.history
        assert decision.llm.desired == 5
    decision = decide([llm(0.0)] * current, current, spec, history, now=307.0)
    assert decision.llm.desired == 3


# --- scaleUp.lookaheadSeconds: sizing for the load expected when new pods are ready ---


def _ahead(seconds: int = 60, max_step: int = 10):
    return make_spec(
        scaleUp={"stabilisationSeconds": 0, "maxStep": max_step, "lookaheadSeconds": seconds}
    )


@pytest.mark.parametrize(
    ("value", "lookahead_s"),
    [(None, 0.0), (0, 0.0), (75, 75.0), (3600, 3600.0)],
)
def test_lookahead_seconds_parses(value, lookahead_s):
    scale_up = {"stabilisationSeconds": 0, "maxStep": 4}
    if value is not None:
        scale_up["lookaheadSeconds"] = value
    assert make_spec(scaleUp=scale_up).scale_up.lookahead_s == lookahead_s


@pytest.mark.parametrize(
    ("key", "section", "match"),
    [
        ("scaleUp", {"lookaheadSeconds": -1}, r"spec\.scaleUp\.lookaheadSeconds: -1 is outside"),
        ("scaleUp", {"lookaheadSeconds": 3601}, r"spec\.scaleUp\.lookaheadSeconds: 3601"),
        ("scaleUp", {"lookaheadSeconds": 7.5}, r"spec\.scaleUp\.lookaheadSeconds: 7\.5 is not"),
        ("scaleUp", {"lookaheadSeconds": "60"}, r"spec\.scaleUp\.lookaheadSeconds: '60' is not"),
        ("scaleUp", {"lookaheadSeconds": True}, r"spec\.scaleUp\.lookaheadSeconds: True is not"),
        # A fall is never projected, so the field has no meaning for scaling down.
        ("scaleDown", {"lookaheadSeconds": 60}, r"spec\.scaleDown: unknown field\(s\) lookahead"),
    ],
)
def test_lookahead_seconds_refused(key, section, match):
    with pytest.raises(kopf.PermanentError, match=match):
        make_spec(**{key: section})


def rounds(spec, per_round, encoders=None, step_s=15.0):
    """Decide once per round from each round's LLM pods (a list of loads; its length is the
    pool's size) and, optionally, each round's encoder pool; return every decision."""
    history, decisions = History(), []
    for i, pods in enumerate(per_round):
        encoder = encoders[i] if encoders else None
        decision = decide(pods, len(pods), spec, history, now=i * step_s, encoder=encoder)
        history = decision.history
        decisions.append(decision)
    return decisions


@pytest.mark.parametrize(
    ("case", "per_round", "without", "with_lookahead"),
    [
        # 2 waiting -> 4 over 15 s: 16 more in 60 s, 20 / 4 per pod -> 5 pods.
        ("queue rose once", [[llm(0.5)] * 2, [llm(0.5, waiting=2)] * 2], 2, 5),
        # KV 0.25 -> 0.5 per pod is one rise: a step (load that arrived), not a trend.
        ("ratio rose once", [[llm(0.25)] * 2, [llm(0.5)] * 2], 2, 2),
        # Totals 0.6, 0.7, 0.8: two rises of 0.1 per 15 s; 0.8 + 0.4 = 1.2 / 0.5 -> 3.
        ("ratio rose twice", [[llm(0.3)] * 2, [llm(0.35)] * 2, [llm(0.4)] * 2], 2, 3),
        # Totals 0.9, 1.35, 1.8 would project to 3.6 (8 pods), but 3 pods show at most 3.0.
        ("ratio capped at 1 per pod", [[llm(0.3)] * 3, [llm(0.45)] * 3, [llm(0.6)] * 3], 4, 6),
        # The queue total rose only because a third pod joined: not a trend.
        ("pods joined", [[llm(0.5)] * 2, [llm(0.5, waiting=4 / 3)] * 3], 3, 3),
        # Totals 0.6, 0.8, 0.9: the slower rise (0.1 per 15 s) gives 1.3 -> 3 pods; the
        # faster one would give 1.7 -> 4.
        ("slower rate", [[llm(0.3)] * 2, [llm(0.4)] * 2, [llm(0.45)] * 2], 2, 3),
    ],
)
def test_lookahead_table(case, per_round, without, with_lookahead):
    plain = rounds(make_spec(), per_round)[-1].llm
    ahead = rounds(_ahead(), per_round)[-1].llm
    assert (plain.desired, ahead.desired) == (without, with_lookahead), case
    assert "rising to" not in plain.message


def test_ratio_cap_lets_the_queue_speak():
    # As in "ratio capped at 1 per pod", with a queue growing too: it drives past the cap.
    per_round = [[llm(0.3)] * 3, [llm(0.45, waiting=2)] * 3, [llm(0.6, waiting=4)] * 3]
    decision = rounds(_ahead(), per_round)[-1].llm
    assert decision.desired == 9  # 12 waiting + 6 per 15 s * 60 s = 36 / 4 per pod
    assert "requests_waiting 12 rising to 36 in 60s" in decision.message


def test_lookahead_never_projects_a_fall():
    # Load falling every round: the same sizes and recommendations with and without.
    per_round = [[llm(0.9 - 0.05 * i, waiting=max(0.0, 6.0 - i))] * 4 for i in range(12)]
    plain = [(d.llm.desired, d.llm.recommended) for d in rounds(make_spec(), per_round)]
    ahead = [(d.llm.desired, d.llm.recommended) for d in rounds(_ahead(), per_round)]
    assert plain == ahead


def test_vision_backlog_rising_is_projected_for_both_pools():
    idle = PoolLoads(current=1, pods=(EncoderLoad(0, 0, busy_ratio=0.8),))
    queued = PoolLoads(current=1, pods=(EncoderLoad(4, 1000, busy_ratio=0.8),))
    per_round = [[llm(0.5)] * 2, [llm(0.5)] * 2]
    plain = rounds(make_spec(), per_round, encoders=[idle, queued])[-1]
    ahead = rounds(_ahead(), per_round, encoders=[idle, queued])[-1]
    # Encoder: 1000 queued vision tokens, +4000 in 60 s at that rate; 5000 / 2000 -> 3.
    assert (plain.encoder.desired, ahead.encoder.desired) == (1, 3)
    # LLM: those tokens are prefill on the way (coupling 1.0): 5000 / 1000 per pod -> 5.
    assert (plain.llm.desired, ahead.llm.desired) == (2, 5)


def test_history_remembers_totals_and_keeps_them_through_a_metrics_gap():
    spec = _ahead()
    first = decide([llm(0.5, waiting=1)] * 2, 2, spec, History(), now=0.0)
    seen = first.history.llm_seen
    assert (seen.time, seen.pods, dict(seen.totals)["requests_waiting"]) == (0.0, 2, 2.0)
    assert seen.rises == ()  # nothing earlier to compare with
    gap = decide([], 2, spec, first.history, now=15.0, failed=2)
    assert gap.history.llm_seen == seen
    # The next round with metrics measures its rise against the last round that had them.
    after = decide([llm(0.5, waiting=4)] * 2, 2, spec, gap.history, now=30.0)
    assert dict(after.history.llm_seen.rises)["requests_waiting"] == pytest.approx(6 / 30)
    assert after.llm.desired == 5  # 8 + 0.2 * 60 = 20 waiting / 4 per pod
