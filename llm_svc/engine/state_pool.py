"""The fixed-size states of a hybrid model's linear-attention layers, beside the KV pages.

A slot holds, for every Gated DeltaNet layer, one conv state [channels, kernel - 1] and one
recurrent state [value_heads, key_dim, value_dim], both fp32: the reference computes the
recurrence in fp32, and a bf16 state would round at every token of a long prompt.
Slots [0, running_slots) belong to running sequences (one each, so admission, bounded by
`max_num_seqs`, always finds one); the rest hold prefix-cache snapshots, the state as it
was after the first `depth` pages of a cached prefix (docs/design/engine.md).

Under tensor parallelism every rank holds a pool of its own heads' states, with the same
slots: rank 0's pool writes its resets and copies into the runner's journal (`journal`),
which the step channel carries to the other ranks; they `replay` it before the step that
follows.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import torch

from llm_svc.engine.models.config import LinearAttentionShape

STATE_DTYPE = torch.float32
RESET, COPY = 0, 1


class StatePool:
    """conv [layers, slots, channels, kernel - 1] and recurrent [layers, slots, heads, dk, dv].

    Paired actions: `take_running` / `give_running`, `take_snapshot` / `give_snapshot`;
    `reset`, `copy` act on the device in stream order."""

    def __init__(
        self,
        shape: LinearAttentionShape,
        num_layers: int,
        running_slots: int,
        snapshot_slots: int,
        device: torch.device,
        journal: list[tuple[int, int, int]] | None = None,
    ) -> None:
        self.shape = shape
        # Rank 0 under tensor parallelism: (RESET, slot, 0) and (COPY, source, target) are
        # appended to the runner's journal (shared with the host tier's copies, in order).
        self.journal = journal
        total = running_slots + snapshot_slots
        self.conv = torch.zeros(
            (num_layers, total, shape.conv_channels, shape.conv_kernel - 1),
            dtype=STATE_DTYPE,
            device=device,
        )
        self.recurrent = torch.zeros(
            (num_layers, total, shape.num_value_heads, shape.key_head_dim, shape.value_head_dim),
            dtype=STATE_DTYPE,
            device=device,
        )
        self.running_slots = running_slots
        self.snapshot_slots = snapshot_slots
        self._free_running = deque(range(running_slots))
        self._free_snapshots = deque(range(running_slots, total))

    @staticmethod
    def bytes_per_slot(shape: LinearAttentionShape, num_layers: int) -> int:
        conv = shape.conv_channels * (shape.conv_kernel - 1)
        recurrent = shape.num_value_heads * shape.key_head_dim * shape.value_head_dim
        itemsize = torch.empty((), dtype=STATE_DTYPE).element_size()
        return num_layers * (conv + recurrent) * itemsize

    @property
    def num_free_running(self) -> int:
        return len(self._free_running)

    @property
    def num_free_snapshots(self) -> int:
        return len(self._free_snapshots)

    def take_running(self) -> int:
        assert self._free_running, "more running sequences than max_num_seqs"
        return self._free_running.popleft()

    def give_running(self, slot: int) -> None:
        self._free_running.append(slot)

    def take_snapshot(self) -> int | None:
        """A free snapshot slot, or None when every one holds a snapshot."""
        return self._free_snapshots.popleft() if self._free_snapshots else None

    def give_snapshot(self, slot: int) -> None:
        self._free_snapshots.append(slot)

    def reset(self, slot: int) -> None:
        """A sequence's start: no history."""
        self.conv[:, slot].zero_()
        self.recurrent[:, slot].zero_()
        if self.journal is not None:
            self.journal.append((RESET, slot, 0))

    def copy(self, source: int, target: int) -> None:
        self.conv[:, target].copy_(self.conv[:, source])
        self.recurrent[:, target].copy_(self.recurrent[:, source])
        if self.journal is not None:
            self.journal.append((COPY, source, target))

    def replay(self, journal: list[tuple[int, int, int]]) -> None:
        """Apply another pool's journal, in its order."""
        for kind, first, second in journal:
            if kind == RESET:
                self.reset(first)
            else:
                self.copy(first, second)


@dataclass(frozen=True)
class HybridSizing:
    """How a hybrid model's byte budget splits between KV pages and state slots."""

    num_pages: int
    running_slots: int
    snapshot_slots: int


def split_budget(
    budget: int,
    kv_bytes_per_page: int,
    slot_bytes: int,
    running_slots: int,
    snapshot_interval: int | None,
) -> HybridSizing:
    """Running slots first (one per possible running sequence); then each page is charged
    its KV plus 1/k of a snapshot (`snapshot_interval` k pages per snapshot; None: no
    prefix cache, no snapshots). ValueError naming the parts if not one page fits."""
    left = budget - running_slots * slot_bytes
    if snapshot_interval is None:
        pages = left // kv_bytes_per_page
        snapshots = 0
    else:
        pages = left * snapshot_interval // (kv_bytes_per_page * snapshot_interval + slot_bytes)
        snapshots = max(1, pages // snapshot_interval)
    if pages < 1:
        raise ValueError(
            f"budget {budget} bytes - {running_slots} running state slots x {slot_bytes} "
            f"bytes leaves less than one KV page ({kv_bytes_per_page} bytes)"
        )
    return HybridSizing(int(pages), running_slots, int(snapshots))
