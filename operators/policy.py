"""The scaling decision: a pure function from pod loads, spec and history to replicas.

`desired_replicas(loads, spec, history)` never reads clocks, the network or globals: the
time is `loads.now` and the past is `history`, and it returns the new history inside the
decision. The handlers feed it scraped loads; the benchmark feeds it a simulator.

Per pool (LLM, encoder), per metric: the pool's total load over its target per pod gives a
pod count; the largest wins. A pod whose scrape failed counts as loaded like the average of
the pods that answered (never as idle), and while any scrape fails the pool is never scaled
down. Vision tokens queued at the encoders are prefill about to reach the LLM pods, so
(times the coupling factor) they add to the LLM's pending prefill tokens. The pool's
headroom (spare replicas for a burst while new pods start) is added, but never takes the
pool above minReplicas + headroom or what the load needs, whichever is larger: spare pods
are for a burst over a quiet pool, and a pool whose load already needs more is serving
the burst (spare pods on top would size it for a burst on a burst). Then: a tolerance
band around the current size, HPA-like stabilisation (up to the lowest recommendation of the
up window, down to the highest of the down window), a max step per change, min/max.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from operators.spec import AutoscalerSpec, PoolSpec, ScaleBehaviour


@dataclass(frozen=True)
class LLMLoad:
    """One LLM pod's load as read from its /metrics."""

    kv_utilisation: float
    requests_waiting: float
    pending_prefill_tokens: float


@dataclass(frozen=True)
class EncoderLoad:
    """One encoder pod's load as read from its /metrics."""

    queued_images: float
    queued_vision_tokens: float
    busy_ratio: float


@dataclass(frozen=True)
class PoolLoads:
    """What is known of one pool this round."""

    current: int  # the Deployment's spec.replicas now
    pods: Sequence[LLMLoad] | Sequence[EncoderLoad] = ()  # pods that answered
    failed: int = 0  # selected pods whose scrape failed this round


@dataclass(frozen=True)
class Loads:
    """Input of one decision: both pools and the time (seconds, any monotonic origin)."""

    llm: PoolLoads
    encoder: PoolLoads
    now: float


@dataclass(frozen=True)
class History:
    """Recommendations of past rounds, (time, replicas), oldest first, per pool."""

    llm: tuple[tuple[float, int], ...] = ()
    encoder: tuple[tuple[float, int], ...] = ()


@dataclass(frozen=True)
class PoolDecision:
    """The decision for one pool, with a CamelCase reason and a message for people."""

    current: int
    desired: int
    recommended: int  # from the loads alone, before stabilisation, step and bounds
    reason: str  # ScaleUp, ScaleDown, WithinTolerance, Stabilising, NoMetrics, ...
    message: str
    limited: str | None = None  # MaxReplicas, MinReplicas or MaxStep when a bound cut in
    active: bool = True  # False when no pod's metrics could be read


@dataclass(frozen=True)
class Decision:
    """Both pools' decisions and the history to pass to the next call."""

    llm: PoolDecision
    encoder: PoolDecision
    history: History = field(default_factory=History)


def desired_replicas(loads: Loads, spec: AutoscalerSpec, history: History) -> Decision:
    """Decide both pools' replicas for this round (pure; see the module docstring)."""
    encoder_totals = _encoder_totals(loads.encoder)
    vision_backlog = encoder_totals.get("queued_vision_tokens", 0.0)
    llm_totals = _llm_totals(loads.llm, vision_backlog * spec.prefill_tokens_per_vision_token)
    encoder_decision, encoder_past = _decide_pool(
        loads.encoder,
        encoder_totals,
        _encoder_targets(spec),
        spec.encoder,
        spec,
        history.encoder,
        loads.now,
    )
    llm_decision, llm_past = _decide_pool(
        loads.llm, llm_totals, _llm_targets(spec), spec.llm, spec, history.llm, loads.now
    )
    return Decision(llm_decision, encoder_decision, History(llm=llm_past, encoder=encoder_past))


# metric name -> estimated pool total (the sum of that metric over all the pool's pods)
Totals = dict[str, float]


def _scale_to_pool(pool: PoolLoads, values: list[float]) -> float:
    """Sum over the pods that answered, plus the average for each pod that did not."""
    answered = len(values)
    return sum(values) * (answered + pool.failed) / answered


def _llm_totals(pool: PoolLoads, coupled_prefill: float) -> Totals:
    pods: Sequence[LLMLoad] = pool.pods  # type: ignore[assignment]
    if not pods:
        return {}
    pending = _scale_to_pool(pool, [p.pending_prefill_tokens for p in pods])
    return {
        "kv_utilisation": _scale_to_pool(pool, [p.kv_utilisation for p in pods]),
        "requests_waiting": _scale_to_pool(pool, [p.requests_waiting for p in pods]),
        "pending_prefill_tokens": pending + coupled_prefill,
    }


def _encoder_totals(pool: PoolLoads) -> Totals:
    pods: Sequence[EncoderLoad] = pool.pods  # type: ignore[assignment]
    if not pods:
        return {}
    return {
        "queued_vision_tokens": _scale_to_pool(pool, [p.queued_vision_tokens for p in pods]),
        "busy_ratio": _scale_to_pool(pool, [p.busy_ratio for p in pods]),
    }


def _llm_targets(spec: AutoscalerSpec) -> dict[str, float]:
    t = spec.llm_targets
    return {
        "kv_utilisation": t.kv_utilisation,
        "requests_waiting": t.requests_waiting,
        "pending_prefill_tokens": t.pending_prefill_tokens,
    }


def _encoder_targets(spec: AutoscalerSpec) -> dict[str, float]:
    t = spec.encoder_targets
    return {"queued_vision_tokens": t.queued_vision_tokens, "busy_ratio": t.busy_ratio}


def _decide_pool(
    pool: PoolLoads,
    totals: Totals,
    targets: dict[str, float],
    pool_spec: PoolSpec,
    spec: AutoscalerSpec,
    past: tuple[tuple[float, int], ...],
    now: float,
) -> tuple[PoolDecision, tuple[tuple[float, int], ...]]:
    current = pool.current
    if not totals:
        desired, limited = _clamp(current, pool_spec)
        message = f"no pod's /metrics could be read ({pool.failed} failed); holding {current}"
        decision = PoolDecision(current, desired, current, "NoMetrics", message, limited, False)
        return decision, past

    # pods needed per metric = pool total / per-pod target; the busiest metric decides,
    # and the pool's headroom is kept on top of it up to minReplicas + headroom.
    needs = {name: total / targets[name] for name, total in totals.items()}
    driver = max(needs, key=lambda name: needs[name])
    need = _with_headroom(needs[driver], pool_spec)
    base = max(current, 1)
    if abs(need / base - 1.0) <= spec.tolerance:
        recommended, reason = current, "WithinTolerance"
    else:
        recommended = math.ceil(need - 1e-9)
        reason = "ScaleUp" if recommended > current else "ScaleDown"
    if pool.failed and recommended < current:
        # A missing pod might be the busy one: never shrink on partial information.
        recommended, reason = current, "MetricGaps"
    recommended = max(recommended, 0)

    kept = _remember(past, now, recommended, spec)
    target = _stabilise(kept, current, now, spec.scale_up, spec.scale_down)
    if target != recommended and reason in ("ScaleUp", "ScaleDown"):
        reason = "Stabilising"
    stepped, limited = _step(current, target, spec)
    desired, clamp_limited = _clamp(stepped, pool_spec)
    limited = clamp_limited or limited
    if desired > current:
        reason = "ScaleUp"
    elif desired < current:
        reason = "ScaleDown"
    message = (
        f"{driver} {totals[driver]:.4g} over {len(pool.pods)} pod(s)"
        f"{f' (+{pool.failed} unread)' if pool.failed else ''}, target {targets[driver]:.4g}"
        f"/pod -> needs {need:.3g}"
        f"{f' (with headroom {pool_spec.headroom})' if pool_spec.headroom else ''}; "
        f"recommended {recommended}, desired {desired}"
    )
    return PoolDecision(current, desired, recommended, reason, message, limited), kept


def _with_headroom(load_need: float, pool_spec: PoolSpec) -> float:
    """The load's pod count plus the headroom, capped at max(load need, minReplicas +
    headroom): a quiet pool keeps `headroom` spare pods; as the load grows into them they
    stop being spare, and a load that needs more than the cap gets no spare on top."""
    quiet_size = pool_spec.min_replicas + pool_spec.headroom
    return max(load_need, min(load_need + pool_spec.headroom, quiet_size))


def _remember(
    past: tuple[tuple[float, int], ...], now: float, recommended: int, spec: AutoscalerSpec
) -> tuple[tuple[float, int], ...]:
    """The rounds inside the longest window, the newest round before it (it shows that the
    window is covered), and this round."""
    horizon = max(spec.scale_up.stabilisation_s, spec.scale_down.stabilisation_s)
    inside = tuple((t, r) for t, r in past if now - t <= horizon)
    before = [(t, r) for t, r in past if now - t > horizon]
    return tuple(before[-1:]) + inside + ((now, recommended),)


def _stabilise(
    kept: tuple[tuple[float, int], ...],
    current: int,
    now: float,
    up: ScaleBehaviour,
    down: ScaleBehaviour,
) -> int:
    """Up only as far as every recommendation of the up window agrees; down likewise, and
    only once the history covers the whole down window (after a start, the current size
    stands until a full window of lower recommendations says otherwise)."""
    up_floor = min(r for t, r in kept if now - t <= up.stabilisation_s)
    if up_floor > current:
        return up_floor
    covered = kept[0][0] <= now - down.stabilisation_s
    down_ceiling = max(r for t, r in kept if now - t <= down.stabilisation_s)
    if covered and down_ceiling < current:
        return down_ceiling
    return current


def _step(current: int, target: int, spec: AutoscalerSpec) -> tuple[int, str | None]:
    if target > current + spec.scale_up.max_step:
        return current + spec.scale_up.max_step, "MaxStep"
    if target < current - spec.scale_down.max_step:
        return current - spec.scale_down.max_step, "MaxStep"
    return target, None


def _clamp(replicas: int, pool_spec: PoolSpec) -> tuple[int, str | None]:
    if replicas > pool_spec.max_replicas:
        return pool_spec.max_replicas, "MaxReplicas"
    if replicas < pool_spec.min_replicas:
        return pool_spec.min_replicas, "MinReplicas"
    return replicas, None
