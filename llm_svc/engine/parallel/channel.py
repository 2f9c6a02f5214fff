"""Rank 0 hands each step to the other ranks: one small host message, then the step's
integer tensors packed into one, then its image rows (when it has any).

What crosses per step (every rank runs the same forward from it):
- host (gloo): kind, token count T, sequences B, block-table width W, sampled rows N,
  image rows R, position rows (1, or 3 with M-RoPE), and each sequence's query start,
  query length and context length (the attention plan is built from host lists); for a
  hybrid model also each sequence's state slot, and, in a second message when there are
  any, rank 0's journal since the last step (J state-pool resets and copies and host-tier
  saves and loads, which the other ranks replay in order before the step:
  llm_svc/engine/state_pool.py, llm_svc/engine/host_tier.py);
- device, int64: input ids [T], positions [P, T], KV slots [T], block tables [B, W],
  sampled rows [N], image destination rows [R]; for a model with a window pool (sliding
  layers' pages of their own) also its slots [T] and tables [B, V];
- device, the model dtype: image embedding rows [R, hidden].
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from llm_svc.engine.attention import AttentionMetadata
from llm_svc.engine.parallel.group import RankGroup

STEP, STOP, PING = 1, 2, 3
# kind, T, B, W, N, R, P, U (attend_until sent), S (state slots sent), J, V (window width)
_FIELDS = 11


@dataclass
class StepMessage:
    """A step as every rank sees it: the model's inputs and its image rows, flattened
    (`image_dest[i]` is the packed row that `image_source[i]` replaces)."""

    input_ids: torch.Tensor
    positions: torch.Tensor
    meta: AttentionMetadata
    sample_rows: torch.Tensor
    image_dest: torch.Tensor | None
    image_source: torch.Tensor | None
    state_slots: list[int] | None = None  # hybrid models: each sequence's slot
    journal: list[tuple[int, int, int]] = field(default_factory=list)  # rank 0's, replayed


class StepChannel:
    """`send` (rank 0) and `recv` (the others) of one step, or of STOP / PING."""

    def __init__(self, group: RankGroup, max_seqs: int, hidden: int, dtype: torch.dtype):
        self.group, self.max_seqs = group, max_seqs
        self.hidden, self.dtype = hidden, dtype

    def _header(self) -> torch.Tensor:
        return torch.zeros(_FIELDS + 4 * self.max_seqs, dtype=torch.int64)

    def send_control(self, kind: int) -> None:
        header = self._header()
        header[0] = kind
        self.group.broadcast_host(header)

    def send(self, step: StepMessage) -> None:
        meta = step.meta
        count, batch = step.input_ids.shape[0], len(meta.query_starts)
        rows = 0 if step.image_dest is None else step.image_dest.shape[0]
        positions = step.positions.reshape(-1, count)
        header = self._header()
        sizes = [STEP, count, batch, meta.block_tables.shape[1], step.sample_rows.shape[0]]
        until, slots = meta.attend_until, step.state_slots
        windows = meta.window_block_tables
        flags = [until is not None, slots is not None, len(step.journal)]
        flags.append(0 if windows is None else windows.shape[1])
        header[:_FIELDS] = torch.tensor([*sizes, rows, positions.shape[0], *flags])
        lists = [*meta.query_starts, *meta.query_lens, *meta.context_lens, *(slots or [])]
        header[_FIELDS : _FIELDS + len(lists)] = torch.tensor(lists)
        self.group.broadcast_host(header)
        if step.journal:
            self.group.broadcast_host(torch.tensor(step.journal, dtype=torch.int64))
        parts = [step.input_ids, positions.reshape(-1), meta.slot_mapping]
        parts += [meta.block_tables.reshape(-1), step.sample_rows]
        if until is not None:
            parts.append(until)
        if windows is not None:
            parts += [meta.window_slot_mapping, windows.reshape(-1)]
        if rows:
            parts.append(step.image_dest.to(self.group.device))
        self.group.broadcast(torch.cat(parts))
        if rows:
            self.group.broadcast(step.image_source.to(self.dtype).contiguous())

    def recv(self) -> tuple[int, StepMessage | None]:
        """(kind, the step for STEP else None)."""
        header = self.group.broadcast_host(self._header())
        fields = header[:_FIELDS].tolist()
        kind, count, batch, width, sampled, rows, pos_rows, has_until, has_slots = fields[:9]
        entries, window_width = fields[9:]
        if kind != STEP:
            return kind, None
        lists = header[_FIELDS : _FIELDS + (3 + has_slots) * batch].tolist()
        journal = []
        if entries:
            journal = self.group.broadcast_host(torch.empty(entries, 3, dtype=torch.int64))
            journal = [tuple(entry) for entry in journal.tolist()]
        windowed = count if window_width else 0
        sizes = [count, pos_rows * count, count, batch * width, sampled, count * has_until]
        sizes += [windowed, batch * window_width, rows]
        packed = torch.empty(sum(sizes), dtype=torch.int64, device=self.group.device)
        parts = self.group.broadcast(packed).split(sizes)
        ids, positions, slots, tables, sample_rows, until, window_slots, windows, dest = parts
        source = None
        if rows:
            source = torch.empty(rows, self.hidden, dtype=self.dtype, device=self.group.device)
            self.group.broadcast(source)
        meta = AttentionMetadata(
            slot_mapping=slots,
            query_starts=lists[:batch],
            query_lens=lists[batch : 2 * batch],
            context_lens=lists[2 * batch : 3 * batch],
            block_tables=tables.view(batch, width),
            attend_until=until if has_until else None,
        )
        if window_width:
            meta.window_slot_mapping = window_slots
            meta.window_block_tables = windows.view(batch, window_width)
        positions = positions.view(pos_rows, count) if pos_rows > 1 else positions
        slots = lists[3 * batch :] if has_slots else None
        step = StepMessage(ids, positions, meta, sample_rows, dest if rows else None, source)
        step.state_slots, step.journal = slots, journal
        return kind, step
