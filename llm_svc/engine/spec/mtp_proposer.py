"""Drafts from Qwen3.5's MTP layer (spec/mtp.py), chained greedily for k tokens.

The MTP layer at position i reads the target's last hidden state h_i and token i + 1. After
each target step the engine hands over the step's hidden states (`observe`); they wait,
per sequence, until the token after each is known. When the sequence next decodes,
`propose` runs the layer over the positions it has not yet seen (their KV joins the
sequence's own MTP KV), up to n - 2 for a sequence of n tokens: the target's hidden state
at the last accepted position and the embedding of the last accepted token give draft 1.
Draft i + 1 comes from the layer's own output at the position before and the embedding of
draft i, each the argmax of the target's LM head (a point mass, as the Proposer contract
says). The chain's KV entries are dropped afterwards: those positions are decided by the
verification, and computed again from the target's hidden states once accepted.

Positions the target did not compute for a sequence (a prefix-cache hit, tokens before a
preemption) have no MTP KV: the layer attends from the first position it saw. Drafts are
then less likely to match, never wrong: the verifier decides every token."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from llm_svc.engine.sequence import Sequence
from llm_svc.engine.spec.mtp import DenseKV, MTPLayer
from llm_svc.engine.spec.proposer import Proposer

# Waiting hidden states past which `observe` runs the layer over those it can: a sequence
# that does not draft for long (a grammar, a large batch) keeps a bounded number.
CATCH_UP_ROWS = 256


@dataclass
class MTPState:
    """A sequence's MTP KV (positions [first, end)) and the target's hidden states of
    positions [waiting_start, waiting_start + len(waiting)) not yet run through it."""

    first: int
    end: int
    kv: DenseKV = field(default_factory=DenseKV)
    waiting: torch.Tensor | None = None
    waiting_start: int = 0
    last_out: torch.Tensor | None = None  # the layer's output [1, H] at position end - 1

    def restart(self, position: int) -> None:
        self.first = self.end = position
        self.kv = DenseKV()
        self.last_out = None


class MTPProposer(Proposer):
    name = "mtp"
    needs_hidden = True

    def __init__(self, layer: MTPLayer, target) -> None:
        self.layer = layer
        self.target = target  # the Qwen3_5LM: its embedding and LM head are shared
        self.vocab_size = target.config.vocab_size
        self.states: dict[Sequence, MTPState] = {}

    def forget(self, seq: Sequence) -> None:
        self.states.pop(seq, None)

    def observe(self, seq: Sequence, start: int, hidden: torch.Tensor) -> None:
        """The target's hidden states [n, H] of `seq`'s positions [start, start + n), as
        one step computed them; they replace any kept for those positions."""
        state = self.states.get(seq)
        if state is None:
            state = self.states[seq] = MTPState(start, start)
        if start < state.end:  # computed again (a rollback or a recompute): from there on
            if start <= state.first:
                state.restart(start)
            else:
                state.kv.truncate(start - state.first)
                state.end, state.last_out = start, None
        waiting, begin = state.waiting, state.waiting_start
        if waiting is not None and begin <= start <= begin + len(waiting):
            state.waiting = torch.cat([waiting[: start - begin], hidden])
        else:  # a copy: a view would keep the whole step's hidden states alive
            state.waiting, state.waiting_start = hidden.clone(), start
        if len(state.waiting) >= CATCH_UP_ROWS:
            # Up to the last position whose next token is read (no draft, no placeholder).
            read = len(seq.token_ids) - seq.num_pending - seq.num_drafts
            last = min(read - 2, state.waiting_start + len(state.waiting) - 1)
            with torch.inference_mode():
                self._catch_up(seq, state, last)

    @torch.inference_mode()
    def propose(self, seq: Sequence, k: int) -> list[int]:
        state = self.states.get(seq)
        out = None if state is None else self._catch_up(seq, state, seq.num_tokens - 2)
        if out is None:
            return []
        drafts = []
        for step in range(k):
            token = int(self.target.compute_logits(out).argmax(dim=-1))
            drafts.append(token)
            if step + 1 < k:
                out = self._run(seq, state, state.end + step, out, [token])
        state.kv.truncate(state.end - state.first)
        return drafts

    def _catch_up(self, seq: Sequence, state: MTPState, last: int) -> torch.Tensor | None:
        """The layer's output at `last` (the last position whose next token is known),
        after running it over the positions up to there it has not seen; None if the
        target's hidden states for them are missing."""
        if state.end == last + 1 and state.last_out is not None:  # drafts not scheduled
            return state.last_out
        waiting, begin = state.waiting, state.waiting_start
        if waiting is None or begin + len(waiting) <= last:
            return None
        if begin > state.end:  # a gap (a prefix hit): the layer starts again from here
            state.restart(begin)
        if state.end > last:
            return None
        hidden = waiting[state.end - begin : last + 1 - begin]
        state.waiting, state.waiting_start = waiting[last + 1 - begin :], last + 1
        out = self._run(seq, state, state.end, hidden, seq.token_ids[state.end + 1 : last + 2])
        state.end, state.last_out = last + 1, out[-1:]
        return state.last_out

    def _run(self, seq: Sequence, state: MTPState, start: int, hidden: torch.Tensor,
             next_tokens: list[int]) -> torch.Tensor:  # fmt: skip
        """The layer over positions [start, start + len(next_tokens)) of `seq`, appending
        their KV to the state's."""
        device = hidden.device
        ids = np.asarray(next_tokens, dtype=np.int64)
        # A prompt's multimodal sentinels (ids past the vocabulary) have no embedding: the
        # layer reads token 0 there (only drafts depend on it).
        ids[(ids < 0) | (ids >= self.vocab_size)] = 0
        positions = np.ascontiguousarray(seq.positions(start, start + len(next_tokens)))
        ids = torch.as_tensor(ids, device=device)
        positions = torch.as_tensor(positions, device=device)
        return self.layer(hidden, self.target.embed(ids), positions, state.kv)
