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
    # Half-open token spans of the images (and video frame groups), and this gateway's
    # measured encode time per image token (0: none measured): the vision share of a time
    # estimate (plugins/estimated_ttft.py).
    image_spans: list[tuple[int, int]] = field(default_factory=list)
    encode_seconds_per_token: float = 0.0
    _hashes: dict[int, list[bytes]] = field(default_factory=dict, repr=False)

    def block_hashes(self, page_size: int) -> list[bytes]:
        """The prompt's chained block hashes at a pod's page size (computed once per size)."""
        hashes = self._hashes.get(page_size)
        if hashes is None:
            hashes = block_hashes(self.fingerprint, self.input_ids, page_size, self.salt)
            self._hashes[page_size] = hashes
        return hashes

    def matched_blocks(self, pod: Pod, index: KVIndex) -> tuple[int, int]:
        """(blocks of this prompt the pod will resume, the blocks it may resume at most).
        Resumed blocks are those it holds in either tier or, with the shared KV store, can
        fetch from there: `cached_blocks(...).resumed`."""
        cached = self.cached_blocks(pod, index)
        return cached.resumed, cached.most

    def cached_blocks(self, pod: Pod, index: KVIndex) -> CachedBlocks:
        """Where the prompt's leading blocks are for `pod`, each depth by the pod's own rule
        (`Pod.resume_rule`, the one its block manager matches by) over what the KV index
        says it holds: no more count as covered."""
        hashes = self.block_hashes(pod.page_size)
        rule = pod.resume_rule
        count, spans = len(self.input_ids), self.uncut_spans
        most = rule.resumable_blocks(count, uncut_spans=spans)
        snapshots = None
        if rule.snapshot_interval:  # a hybrid pod resumes only where it holds a snapshot

            def snapshots(depth: int) -> bool:
                return index.has_snapshot(pod.address, hashes[depth - 1])

        windows = None
        if rule.window:  # a sliding layer resumes only over a whole window of its pages

            def windows(block: int) -> bool:
                return index.has_window(pod.address, hashes[block])

        def resumed(held: int) -> int:
            return rule.resumable_blocks(count, held, spans, snapshots, windows)

        address = pod.address
        held = resumed(index.matched_blocks(address, hashes, most))
        device = held  # a pod with nothing in host memory holds all of it on its device
        if index.holds_in_host(address):
            device = min(held, resumed(index.device_blocks(address, hashes, most)))
        store = 0
        if pod.load.rates.kv_store:
            # The store keeps a page's window page and snapshot beside it: assumed there.
            store = rule.resumable_blocks(count, index.store_blocks(hashes, most), spans)
        return CachedBlocks(device, held, store, most)


@dataclass(frozen=True)
class CachedBlocks:
    """Leading prompt blocks a pod would resume from each place (each a resume point by its
    rule): on its `device`, `held` in either of its tiers (>= device), fetched from the
    shared KV `store` (0 for a pod without it); and the `most` it could resume."""

    device: int
    held: int
    store: int
    most: int

    @property
    def resumed(self) -> int:
        """The deepest it resumes: the pod fetches from the store past what it holds."""
        return max(self.held, self.store)


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
