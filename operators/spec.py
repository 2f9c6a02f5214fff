"""The IrisAutoscaler spec as typed, checked, frozen pydantic models.

The CRD schema (operators/crd.yaml) already rejects most bad specs at the API server; this
module checks again (an API server without the CRD's validation, or an older CRD, may let
them through), fills the defaults, and checks what a schema cannot express (min <= max).
Every problem raises `kopf.PermanentError` naming the field, the value and the limit.
Fields are read in the CRD's camelCase and used in snake_case.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import kopf
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from pydantic.alias_generators import to_camel

from iris import metrics
from iris.settings import validation_message

_NAME = r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$"
_MAX_REPLICAS = 1000


class _Part(BaseModel):
    # strict: "8" is no integer and true no number; unknown fields are refused.
    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="forbid",
        frozen=True,
        strict=True,
        allow_inf_nan=False,
    )


class LLMTargets(_Part):
    """Per-pod load at which the LLM pool is sized right."""

    kv_utilisation: float = Field(0.75, gt=0, le=1)
    requests_waiting: float = Field(4.0, gt=0)
    pending_prefill_tokens: float = Field(16384.0, gt=0)


class EncoderTargets(_Part):
    """Per-pod load at which the encoder pool is sized right."""

    queued_vision_tokens: float = Field(8192.0, gt=0)
    busy_ratio: float = Field(0.8, gt=0, le=1)


class Selector(_Part):
    match_labels: dict[str, str] = Field(min_length=1)


class PoolSpec(_Part):
    """One Deployment the autoscaler sizes: which pods are its, its bounds, and how many
    replicas it keeps beyond what the load needs (`headroom`: what a burst meets while new
    pods start; more headroom buys time within the SLO with replica-seconds). Headroom never
    takes the pool above max(what the load needs, min_replicas + headroom)."""

    deployment: str = Field(pattern=_NAME, max_length=253)
    selector: Selector
    min_replicas: int = Field(1, ge=1, le=_MAX_REPLICAS)
    max_replicas: int = Field(ge=1, le=_MAX_REPLICAS)
    headroom: int = Field(0, ge=0, le=_MAX_REPLICAS, alias="headroomReplicas")

    @property
    def match_labels(self) -> Mapping[str, str]:
        return self.selector.match_labels


class LLMPool(PoolSpec):
    metrics_port: int = Field(metrics.LLM_METRICS_PORT, ge=1, le=65535)
    targets: LLMTargets = LLMTargets()


class EncoderPool(PoolSpec):
    metrics_port: int = Field(metrics.ENCODER_METRICS_PORT, ge=1, le=65535)
    targets: EncoderTargets = EncoderTargets()


class ScaleBehaviour(_Part):
    """How fast one direction may move: a recommendation must hold for the whole
    stabilisation window before it is acted on, and one change moves at most max_step."""

    stabilisation_s: int = Field(alias="stabilisationSeconds", ge=0, le=3600)
    max_step: int = Field(ge=1, le=_MAX_REPLICAS)


class ScaleUp(ScaleBehaviour):
    stabilisation_s: int = Field(0, alias="stabilisationSeconds", ge=0, le=3600)
    max_step: int = Field(4, ge=1, le=_MAX_REPLICAS)


class ScaleDown(ScaleBehaviour):
    stabilisation_s: int = Field(300, alias="stabilisationSeconds", ge=0, le=3600)
    max_step: int = Field(1, ge=1, le=_MAX_REPLICAS)


class Coupling(_Part):
    # Prefill tokens expected at the LLM pods per vision token queued at the encoders.
    prefill_tokens_per_vision_token: float = Field(1.0, ge=0, le=100)


class AutoscalerSpec(_Part):
    """The whole spec of one IrisAutoscaler, defaults filled in."""

    llm: LLMPool
    encoder: EncoderPool
    tolerance: float = Field(0.1, ge=0, le=0.9)
    scale_up: ScaleUp = ScaleUp()
    scale_down: ScaleDown = ScaleDown()
    coupling: Coupling = Coupling()

    @property
    def llm_targets(self) -> LLMTargets:
        return self.llm.targets

    @property
    def encoder_targets(self) -> EncoderTargets:
        return self.encoder.targets

    @property
    def prefill_tokens_per_vision_token(self) -> float:
        return self.coupling.prefill_tokens_per_vision_token


def parse_spec(spec: Mapping[str, Any]) -> AutoscalerSpec:
    """Check and type a raw `.spec`; raise kopf.PermanentError naming the bad field."""
    try:
        parsed = AutoscalerSpec.model_validate(dict(spec))
    except ValidationError as err:
        raise kopf.PermanentError(validation_message(err, "spec")) from None
    for where, pool in (("spec.llm", parsed.llm), ("spec.encoder", parsed.encoder)):
        if pool.min_replicas > pool.max_replicas:
            raise kopf.PermanentError(
                f"{where}.minReplicas: {pool.min_replicas} is above "
                f"{where}.maxReplicas ({pool.max_replicas})"
            )
    return parsed
