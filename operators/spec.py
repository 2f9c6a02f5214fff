"""The IrisAutoscaler spec as typed, checked dataclasses.

The CRD schema (operators/crd.yaml) already rejects most bad specs at the API server; this
module checks again (an API server without the CRD's validation, or an older CRD, may let
them through), fills the defaults, and checks what a schema cannot express (min <= max).
Every problem raises `kopf.PermanentError` naming the field, the value and the limit.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import kopf

from iris import metrics

_NAME = re.compile(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")
_MAX_REPLICAS = 1000


@dataclass(frozen=True)
class LLMTargets:
    """Per-pod load at which the LLM pool is sized right."""

    kv_utilisation: float = 0.75
    requests_waiting: float = 4.0
    pending_prefill_tokens: float = 16384.0


@dataclass(frozen=True)
class EncoderTargets:
    """Per-pod load at which the encoder pool is sized right."""

    queued_vision_tokens: float = 8192.0
    busy_ratio: float = 0.8


@dataclass(frozen=True)
class PoolSpec:
    """One Deployment the autoscaler sizes: which pods are its, its bounds, and how many
    replicas it keeps beyond what the load needs (`headroom`: what a burst meets while new
    pods start; more headroom buys time within the SLO with replica-seconds)."""

    deployment: str
    match_labels: Mapping[str, str]
    min_replicas: int
    max_replicas: int
    metrics_port: int
    headroom: int = 0


@dataclass(frozen=True)
class ScaleBehaviour:
    """How fast one direction may move: a recommendation must hold for the whole
    stabilisation window before it is acted on, and one change moves at most max_step."""

    stabilisation_s: float
    max_step: int


@dataclass(frozen=True)
class AutoscalerSpec:
    """The whole spec of one IrisAutoscaler, defaults filled in."""

    llm: PoolSpec
    encoder: PoolSpec
    llm_targets: LLMTargets
    encoder_targets: EncoderTargets
    tolerance: float = 0.1
    scale_up: ScaleBehaviour = ScaleBehaviour(stabilisation_s=0.0, max_step=4)
    scale_down: ScaleBehaviour = ScaleBehaviour(stabilisation_s=300.0, max_step=1)
    # Prefill tokens expected at the LLM pods per vision token queued at the encoders.
    prefill_tokens_per_vision_token: float = 1.0


def parse_spec(spec: Mapping[str, Any]) -> AutoscalerSpec:
    """Check and type a raw `.spec`; raise kopf.PermanentError naming the bad field."""
    _check_keys(spec, "spec", {"llm", "encoder", "tolerance", "scaleUp", "scaleDown", "coupling"})
    llm_raw = _section(spec, "llm", required=True)
    encoder_raw = _section(spec, "encoder", required=True)
    llm_targets_raw = _section(llm_raw, "targets", prefix="spec.llm")
    encoder_targets_raw = _section(encoder_raw, "targets", prefix="spec.encoder")
    _check_keys(
        llm_targets_raw,
        "spec.llm.targets",
        {"kvUtilisation", "requestsWaiting", "pendingPrefillTokens"},
    )
    _check_keys(encoder_targets_raw, "spec.encoder.targets", {"queuedVisionTokens", "busyRatio"})
    llm_targets = LLMTargets(
        kv_utilisation=_ratio(llm_targets_raw, "kvUtilisation", "spec.llm.targets", 0.75),
        requests_waiting=_positive(llm_targets_raw, "requestsWaiting", "spec.llm.targets", 4.0),
        pending_prefill_tokens=_positive(
            llm_targets_raw, "pendingPrefillTokens", "spec.llm.targets", 16384.0
        ),
    )
    encoder_targets = EncoderTargets(
        queued_vision_tokens=_positive(
            encoder_targets_raw, "queuedVisionTokens", "spec.encoder.targets", 8192.0
        ),
        busy_ratio=_ratio(encoder_targets_raw, "busyRatio", "spec.encoder.targets", 0.8),
    )
    coupling = _section(spec, "coupling")
    _check_keys(coupling, "spec.coupling", {"prefillTokensPerVisionToken"})
    return AutoscalerSpec(
        llm=_pool(llm_raw, "spec.llm", metrics.LLM_METRICS_PORT),
        encoder=_pool(encoder_raw, "spec.encoder", metrics.ENCODER_METRICS_PORT),
        llm_targets=llm_targets,
        encoder_targets=encoder_targets,
        tolerance=_number(spec, "tolerance", "spec", 0.1, low=0.0, high=0.9),
        scale_up=_behaviour(spec, "scaleUp", stabilisation_s=0, max_step=4),
        scale_down=_behaviour(spec, "scaleDown", stabilisation_s=300, max_step=1),
        prefill_tokens_per_vision_token=_number(
            coupling, "prefillTokensPerVisionToken", "spec.coupling", 1.0, low=0.0, high=100.0
        ),
    )


def _pool(raw: Mapping[str, Any], where: str, default_port: int) -> PoolSpec:
    _check_keys(
        raw,
        where,
        {
            "deployment",
            "selector",
            "minReplicas",
            "maxReplicas",
            "headroomReplicas",
            "metricsPort",
            "targets",
        },
    )
    name = raw.get("deployment")
    if not isinstance(name, str) or not _NAME.match(name) or len(name) > 253:
        raise kopf.PermanentError(f"{where}.deployment: {name!r} is not a Deployment name")
    selector = _section(raw, "selector", prefix=where, required=True)
    _check_keys(selector, f"{where}.selector", {"matchLabels"})
    labels = selector.get("matchLabels")
    if not isinstance(labels, Mapping) or not labels:
        raise kopf.PermanentError(
            f"{where}.selector.matchLabels: {labels!r} must be a non-empty map of labels"
        )
    for key, value in labels.items():
        if not isinstance(key, str) or not isinstance(value, str):
            raise kopf.PermanentError(
                f"{where}.selector.matchLabels: {key!r}: {value!r} must map strings to strings"
            )
    if "maxReplicas" not in raw:
        raise kopf.PermanentError(f"{where}.maxReplicas is required")
    low = _integer(raw, "minReplicas", where, 1, low=1, high=_MAX_REPLICAS)
    high = _integer(raw, "maxReplicas", where, 1, low=1, high=_MAX_REPLICAS)
    if low > high:
        raise kopf.PermanentError(
            f"{where}.minReplicas: {low} is above {where}.maxReplicas ({high})"
        )
    port = _integer(raw, "metricsPort", where, default_port, low=1, high=65535)
    headroom = _integer(raw, "headroomReplicas", where, 0, low=0, high=_MAX_REPLICAS)
    return PoolSpec(name, dict(labels), low, high, port, headroom)


def _behaviour(spec: Mapping[str, Any], key: str, *, stabilisation_s: int, max_step: int):
    raw = _section(spec, key)
    where = f"spec.{key}"
    _check_keys(raw, where, {"stabilisationSeconds", "maxStep"})
    return ScaleBehaviour(
        stabilisation_s=float(
            _integer(raw, "stabilisationSeconds", where, stabilisation_s, low=0, high=3600)
        ),
        max_step=_integer(raw, "maxStep", where, max_step, low=1, high=_MAX_REPLICAS),
    )


def _section(
    raw: Mapping[str, Any], key: str, *, prefix: str = "spec", required: bool = False
) -> Mapping[str, Any]:
    value = raw.get(key)
    if value is None:
        if required:
            raise kopf.PermanentError(f"{prefix}.{key} is required")
        return {}
    if not isinstance(value, Mapping):
        raise kopf.PermanentError(f"{prefix}.{key}: {value!r} must be an object")
    return value


def _check_keys(raw: Mapping[str, Any], where: str, allowed: set[str]) -> None:
    unknown = sorted(set(raw) - allowed)
    if unknown:
        raise kopf.PermanentError(
            f"{where}: unknown field(s) {', '.join(unknown)}; allowed: {', '.join(sorted(allowed))}"
        )


def _number(
    raw: Mapping[str, Any], key: str, where: str, default: float, *, low: float, high: float
) -> float:
    value = raw.get(key, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise kopf.PermanentError(f"{where}.{key}: {value!r} is not a number")
    if not low <= value <= high:
        raise kopf.PermanentError(f"{where}.{key}: {value!r} is outside [{low}, {high}]")
    return float(value)


def _positive(raw: Mapping[str, Any], key: str, where: str, default: float) -> float:
    value = _number(raw, key, where, default, low=0.0, high=math.inf)
    if value <= 0:
        raise kopf.PermanentError(f"{where}.{key}: {value!r} must be above 0")
    return value


def _ratio(raw: Mapping[str, Any], key: str, where: str, default: float) -> float:
    value = _number(raw, key, where, default, low=0.0, high=1.0)
    if value <= 0:
        raise kopf.PermanentError(f"{where}.{key}: {value!r} must be in (0, 1]")
    return value


def _integer(
    raw: Mapping[str, Any], key: str, where: str, default: int, *, low: int, high: int
) -> int:
    value = raw.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int):
        raise kopf.PermanentError(f"{where}.{key}: {value!r} is not an integer")
    if not low <= value <= high:
        raise kopf.PermanentError(f"{where}.{key}: {value} is outside [{low}, {high}]")
    return value
