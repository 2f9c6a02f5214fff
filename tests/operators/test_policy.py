"""Table tests of the pure scaling policy `desired_replicas`."""

from __future__ import annotations

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


def headroom_spec(min_replicas: int, headroom: int):
    raw_llm = {
        "deployment": "llm",
        "selector": {"matchLabels": {"c": "llm"}},
        "minReplicas": min_replicas,
        "maxReplicas": 10,
        "headroomReplicas": headroom,
        "targets": {"kvUtilisation": 0.5, "requestsWaiting": 4, "pendingPrefillTokens": 1000},
    }
    return make_spec(llm=raw_llm)


def test_headroom_replicas_are_kept_beyond_the_load():
    spec = headroom_spec(min_replicas=3, headroom=2)
    # 3 pods at target need 3, the quiet size; two spare on top.
    decision = decide([llm(0.5)] * 3, 3, spec).llm
    assert (decision.desired, decision.reason) == (5, "ScaleUp")
    assert "headroom 2" in decision.message
    # Already holding the headroom: within tolerance, nothing moves.
    assert decide([llm(0.3)] * 5, 5, spec).llm.reason == "WithinTolerance"


@pytest.mark.parametrize(
    ("case", "pods", "current", "desired"),
    [
        # minReplicas 1 + headroom 2: a quiet pool holds 3.
        ("quiet: both spare pods", [llm(0.25)] * 2, 2, 3),
        ("the load grew into one spare pod", [llm(0.5)] * 2, 2, 3),
        ("the load needs the quiet size: no spare left", [llm(0.5)] * 3, 3, 3),
        # A burst that needs 6 gets 6, not 6 + 2: the spare pods were for it.
        ("a burst above the quiet size: no spare on top", [llm(1.0)] * 3, 3, 6),
    ],
)
def test_headroom_never_takes_the_pool_above_the_quiet_size_or_the_load(
    case, pods, current, desired
):
    decision = decide(pods, current, headroom_spec(min_replicas=1, headroom=2)).llm
    assert decision.desired == desired, case


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
