"""The plugin contract: filters drop pods, scorers rate them in [0, 1], a picker chooses.

A plugin is a small class with a `type` name and a factory taking its YAML `params`. Every
call is made through `Router`, which times it; plugins themselves stay pure functions of the
request, the candidate pods and the KV index.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np

from gateway.routing.kv_index import KVIndex
from gateway.routing.pods import Pod
from iris.multimodal import block_hashes


@dataclass
class RoutingRequest:
    """One request as routing sees it: padded ids, the model fingerprint and the tenant's
    prefix salt (None: shared), which roots the block hashes: the index is per salt."""

    input_ids: np.ndarray
    fingerprint: bytes
    salt: bytes | None = None
    # Half-open spans no resume point falls inside (the pod's engine uses the same).
    uncut_spans: list[tuple[int, int]] = field(default_factory=list)
    _hashes: dict[int, list[bytes]] = field(default_factory=dict, repr=False)

    def block_hashes(self, page_size: int) -> list[bytes]:
        """The prompt's chained block hashes at a pod's page size (computed once per size)."""
        hashes = self._hashes.get(page_size)
        if hashes is None:
            hashes = block_hashes(self.fingerprint, self.input_ids, page_size, self.salt)
            self._hashes[page_size] = hashes
        return hashes

    def matched_blocks(self, pod: Pod, index: KVIndex) -> tuple[int, int]:
        """(blocks of this prompt the pod holds and will resume, the blocks it may resume
        at most). Both are the pod's own rule (`Pod.resume_rule`, the one its block manager
        matches by) over what the KV index says it holds: no more count as covered."""
        hashes = self.block_hashes(pod.page_size)
        rule = pod.resume_rule
        count, spans = len(self.input_ids), self.uncut_spans
        most = rule.resumable_blocks(count, uncut_spans=spans)
        held = index.matched_blocks(pod.address, hashes, most)
        snapshots = None
        if rule.snapshot_interval:  # a hybrid pod resumes only where it holds a snapshot

            def snapshots(depth: int) -> bool:
                return index.has_snapshot(pod.address, hashes[depth - 1])

        windows = None
        if rule.window:  # a sliding layer resumes only over a whole window of its pages

            def windows(block: int) -> bool:
                return index.has_window(pod.address, hashes[block])

        return rule.resumable_blocks(count, held, spans, snapshots, windows), most


class Plugin(ABC):
    type: ClassVar[str]
    kind: ClassVar[str]  # "filter" | "scorer" | "picker"


class Filter(Plugin):
    kind = "filter"
    # The status when this filter leaves no pod: 503 (none up) or 429 (all busy).
    empty_status: ClassVar[int] = 503

    @abstractmethod
    def filter(self, request: RoutingRequest, pods: list[Pod], index: KVIndex) -> list[Pod]:
        """The pods that may take the request."""


class Scorer(Plugin):
    kind = "scorer"

    @abstractmethod
    def score(self, request: RoutingRequest, pods: list[Pod], index: KVIndex) -> list[float]:
        """One score per pod, in order; values outside [0, 1] are clamped by the router."""


class Picker(Plugin):
    kind = "picker"

    @abstractmethod
    def pick(self, pods: Sequence[Pod], scores: Sequence[float]) -> Pod:
        """Choose one of the (non-empty) candidates given their weighted total scores."""


PLUGINS: dict[str, Callable[[dict[str, Any]], Plugin]] = {}


def register(cls: type[Plugin]) -> type[Plugin]:
    """Class decorator: the plugin becomes constructible from YAML as `type: <cls.type>`."""
    PLUGINS[cls.type] = lambda params: cls(**params)
    return cls


def create_plugin(type_name: str, params: dict[str, Any] | None = None) -> Plugin:
    """Build a plugin by name; an unknown name or bad params raise ValueError naming them."""
    factory = PLUGINS.get(type_name)
    if factory is None:
        known = ", ".join(sorted(PLUGINS))
        raise ValueError(f"unknown routing plugin type {type_name!r} (known: {known})")
    try:
        return factory(dict(params or {}))
    except TypeError as err:
        raise ValueError(f"bad params for routing plugin {type_name!r}: {err}") from None
