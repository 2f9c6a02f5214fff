"""The one rule for how much of a cached prefix a pod resumes (docs/design/gateway.md).

A pod and the gateway must give the same answer: the pod takes exactly that many leading
blocks from its prefix cache, and the gateway counts exactly that many as covered (for the
prefix score, the predicted cached tokens and the images it leaves out of the Reserve). So
both build a `PrefixResumeRule` from the same facts, the pod from its model and the gateway
from the pod's GetModelInfo, and ask it with the blocks held (the pod's radix match, the
gateway's KV index over the pod's KV events).

What the rule knows of the model is its attention layers. The cases that exist today:

- every layer FULL: at most `(num_tokens - 1) // page_size` blocks, since the last token is
  always computed (its logits give the first output token), and no more than are held;
- SLIDING layers (a window W) keep pages of their own, and a running sequence gives back
  those that fall out of its window, so a cached block may have lost its sliding page
  while its full-attention pages stay. Resuming after `d` blocks computes position d·P
  next, whose query sees the keys from d·P − W + 1 on: the sliding pages of blocks
  [`window_first_block(d·P, W, P)`, d) must all be held (`windows(i)`: block i still has
  its sliding page; None: every block has). The resume point is the deepest one within
  the other limits whose trailing window is whole.

- LINEAR layers (Gated DeltaNet, Qwen3.5's hybrid models) keep a fixed-size state instead of
  KV, which exists only where the pod kept a snapshot of it: every `snapshot_interval` (k)
  blocks of a cached prefix, while the snapshot has not been evicted. The resume point is
  then the deepest multiple of k blocks, within the FULL rule and the blocks held, at which
  a snapshot is held (`snapshots`; None: at every boundary).

Spans that must not be cut (an image whose tokens attend to each other both ways: Gemma
3) move the resume point back to the span's first block, never inside it; the pod's block
manager and the gateway's routing pass a prompt's spans alike. Layer kinds added later
extend `LayerKind` and this rule together: an unknown kind is refused by name at the
gateway's handshake.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from enum import Enum


class LayerKind(Enum):
    """How one decoder layer attends to the past, as the resumable prefix depends on it."""

    FULL = "full"
    SLIDING = "sliding"
    LINEAR = "linear"


@dataclass(frozen=True)
class AttentionLayer:
    """One decoder layer: its kind, for SLIDING its window (a key is visible to a query
    iff q - k < window), for LINEAR the blocks between two state snapshots."""

    kind: LayerKind = LayerKind.FULL
    window: int = 0
    snapshot_interval: int = 0

    def __post_init__(self) -> None:
        if (self.kind is LayerKind.LINEAR) != (self.snapshot_interval > 0):
            raise ValueError(
                f"a {self.kind.value} layer has snapshot_interval {self.snapshot_interval}: "
                "linear layers need one > 0, others none"
            )
        if self.kind is LayerKind.SLIDING and self.window <= 0:
            raise ValueError(f"a sliding layer needs a window > 0, got {self.window}")
        if self.kind is LayerKind.FULL and self.window:
            raise ValueError(f"a full-attention layer has no window, got {self.window}")


@dataclass(frozen=True)
class PrefixResumeRule:
    """How many leading blocks of a prompt a pod resumes from its prefix cache.

    `layers` are the model's decoder layers in order; none given means every layer is full
    attention (what a pod that reports no layers, from before layers were reported, has)."""

    page_size: int
    layers: tuple[AttentionLayer, ...] = ()

    def __post_init__(self) -> None:
        if self.page_size <= 0:
            raise ValueError(f"page_size must be > 0, got {self.page_size}")
        intervals = {layer.snapshot_interval for layer in self.layers if layer.snapshot_interval}
        if len(intervals) > 1:
            raise ValueError(f"linear layers must share one snapshot interval, got {intervals}")

    @property
    def snapshot_interval(self) -> int | None:
        """Blocks between two resumable points of a hybrid model (None: every block)."""
        return next((lay.snapshot_interval for lay in self.layers if lay.snapshot_interval), None)

    def resumable_blocks(
        self,
        num_tokens: int,
        held_blocks: int | None = None,
        uncut_spans: Iterable[tuple[int, int]] = (),
        snapshots: Callable[[int], bool] | None = None,
        windows: Callable[[int], bool] | None = None,
    ) -> int:
        """Blocks of a `num_tokens` prompt to take from the cache, given that its first
        `held_blocks` blocks are held (None: all of them), that no resume point may fall
        strictly inside a half-open token span [start, end) of `uncut_spans`, for a
        hybrid model that `snapshots(depth)` says whether a state snapshot is held after
        `depth` blocks (None: at every boundary), and for a model with sliding layers that
        `windows(i)` says whether block i (0-based) still has its sliding page (None: every
        block has)."""
        if num_tokens < 0:
            raise ValueError(f"num_tokens must be >= 0, got {num_tokens}")
        blocks = max(0, num_tokens - 1) // self.page_size
        if held_blocks is not None:
            blocks = min(blocks, max(0, held_blocks))
        # Backing off from one span may land inside an earlier one: latest first.
        spans = sorted(uncut_spans, reverse=True)
        interval = self.snapshot_interval or 1
        ask = snapshots if self.snapshot_interval else None
        while True:
            before = blocks
            for start, end in spans:
                if start < blocks * self.page_size < end:
                    blocks = start // self.page_size
            blocks -= blocks % interval
            while blocks and ask is not None and not ask(blocks):
                blocks -= interval
            if windows is not None and self.window:
                blocks = self._whole_window(blocks, windows)
            if blocks == before:
                return blocks

    @property
    def window(self) -> int:
        """The widest sliding window of the model's layers (0: none slides)."""
        return max((layer.window for layer in self.layers), default=0)

    def _whole_window(self, blocks: int, windows: Callable[[int], bool]) -> int:
        """The deepest depth <= `blocks` whose trailing window blocks all have their
        sliding page; each block is asked at most once."""
        size, window = self.page_size, self.window
        depth, index = blocks, blocks - 1
        while depth and index >= window_first_block(depth * size, window, size):
            if windows(index):
                index -= 1
            else:
                depth, index = index, index - 1
        return depth

    def resumable_tokens(
        self,
        num_tokens: int,
        held_blocks: int | None = None,
        uncut_spans: Iterable[tuple[int, int]] = (),
        snapshots: Callable[[int], bool] | None = None,
        windows: Callable[[int], bool] | None = None,
    ) -> int:
        """`resumable_blocks` in tokens."""
        blocks = self.resumable_blocks(num_tokens, held_blocks, uncut_spans, snapshots, windows)
        return blocks * self.page_size


def window_first_block(position: int, window: int, page_size: int) -> int:
    """The first block a query at `position` reads in a layer with sliding `window`: the
    one holding key position − window + 1 (keys before it are out of the window)."""
    return max(0, position - window + 1) // page_size


def all_full(num_layers: int) -> tuple[AttentionLayer, ...]:
    """`num_layers` full-attention layers."""
    return (AttentionLayer(),) * num_layers


def layers_from_windows(windows: Sequence[int | None]) -> tuple[AttentionLayer, ...]:
    """Layers from one window per layer (None or 0: full attention)."""
    return tuple(
        AttentionLayer(LayerKind.SLIDING, window) if window else AttentionLayer()
        for window in windows
    )
