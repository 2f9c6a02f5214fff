"""What the gateway knows about each LLM pod: identity, health and load."""

from __future__ import annotations

from dataclasses import dataclass, field

from gateway.routing.inflight import InflightLedger
from iris.multimodal import AttentionLayer, PrefixResumeRule


@dataclass(frozen=True)
class PodRates:
    """What a pod measured (0: nothing yet) and reports in GetLoad, for the time estimates
    of gateway/routing/plugins/estimated_ttft.py."""

    prefill_tokens_per_s: float = 0.0
    host_load_bytes_per_s: float = 0.0
    store_fetch_bytes_per_s: float = 0.0
    kv_bytes_per_token: int = 0  # 0: the pod has no host tier
    kv_store: bool = False  # the pod reads the shared KV store


@dataclass
class PodLoad:
    """The last GetLoad answer."""

    kv_utilisation: float = 0.0
    running: int = 0
    waiting: int = 0
    pending_prefill_tokens: int = 0
    rates: PodRates = field(default_factory=PodRates)


@dataclass
class Pod:
    """One LLM pod as routing sees it. `healthy` means handshake done and last poll ok;
    `serving` is the pod's own readiness (its gRPC health; true for a pod without one)."""

    address: str
    name: str = ""
    page_size: int = 0
    max_model_len: int = 0
    # The decoder's layers as the pod reports them (GetModelInfo); none: all full attention.
    layers: tuple[AttentionLayer, ...] = ()
    healthy: bool = False
    serving: bool = True
    refused: str | None = None  # why the pod may never be used (e.g. a fingerprint mismatch)
    load: PodLoad = field(default_factory=PodLoad)
    # This gateway's own placements, counted at routing time (fresher than `load`).
    inflight: InflightLedger = field(default_factory=InflightLedger, compare=False, repr=False)

    @property
    def usable(self) -> bool:
        return self.healthy and self.serving and self.refused is None and self.page_size > 0

    @property
    def resume_rule(self) -> PrefixResumeRule:
        """The pod's own resumable-prefix rule, built from what it reported."""
        return PrefixResumeRule(self.page_size, self.layers)

    def __hash__(self) -> int:
        return hash(self.address)
