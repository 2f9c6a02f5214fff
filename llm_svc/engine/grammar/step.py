"""Per step: logit_bias and min_tokens' hold on the end tokens, then one token bitmask for
every constrained row, applied to the logits in place on their device before sampling.
Rows without a constraint, a bias or a min_tokens are never touched, so a free request
samples exactly what it would alone."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from llm_svc.engine.sequence import Sequence


class StepConstraints:
    """Owns the step's bitmask (CPU, pinned on CUDA, grown to the largest batch seen) and
    xgrammar's batch matcher, which fills the constrained rows on its threads."""

    def __init__(
        self, vocab_size: int, device: torch.device, eos_token_ids: frozenset[int] = frozenset()
    ) -> None:
        self.vocab_size = vocab_size
        self.device = device
        self.eos_token_ids = eos_token_ids
        self._bitmask: torch.Tensor | None = None
        self._batch = None

    @torch.inference_mode()  # the logits are an inference tensor
    def apply(self, logits: torch.Tensor, seqs: list[Sequence]) -> None:
        """`logits` [len(seqs), vocab] (fp32) row i belongs to seqs[i]; modified in place."""
        for row, seq in enumerate(seqs):
            if seq.params.logit_bias:
                self._add_bias(logits[row], seq.params.logit_bias)
        rows = [
            row for row, seq in enumerate(seqs) if seq.grammar is not None and seq.grammar.active
        ]
        if rows:
            self._apply_grammars(logits, seqs, rows)
        # After the grammars: a grammar that allows only its end overrides min_tokens.
        for row, seq in enumerate(seqs):
            if seq.params.min_tokens:
                self._hold_back_the_end(logits[row], seq)

    def _apply_grammars(self, logits: torch.Tensor, seqs: list[Sequence], rows: list[int]):
        import xgrammar

        bitmask = self._bitmask_for(len(seqs))
        matchers = [seqs[row].grammar.matcher for row in rows]
        self._batch_matcher().batch_fill_next_token_bitmask(matchers, bitmask, indices=rows)
        mask = bitmask[: len(seqs)]
        if logits.device.type != "cpu":
            mask = mask.to(logits.device, non_blocking=True)
        xgrammar.apply_token_bitmask_inplace(logits, mask, indices=rows, vocab_size=self.vocab_size)

    def _hold_back_the_end(self, row: torch.Tensor, seq: Sequence) -> None:
        """Before `min_tokens` tokens (sampled, read or not), no EOS or stop token id;
        unless the row's grammar allows nothing else (it is complete): its end wins."""
        sampled = len(seq.token_ids) - seq.num_prompt_tokens
        if sampled >= seq.params.min_tokens:
            return
        ends = set(seq.params.stop_token_ids)
        if not seq.params.ignore_eos:
            ends |= self.eos_token_ids
        ends = [token for token in ends if 0 <= token < row.shape[0]]
        if not ends:
            return
        index = torch.tensor(ends, dtype=torch.int64, device=row.device)
        if seq.grammar is not None:
            held = row.index_fill(0, index, float("-inf"))
            if not bool(torch.isfinite(held).any()):
                return
            row.copy_(held)
            return
        row[index] = float("-inf")

    def _add_bias(self, row: torch.Tensor, bias: dict[int, float]) -> None:
        ids = torch.tensor(list(bias), dtype=torch.int64, device=row.device)
        values = torch.tensor(list(bias.values()), dtype=row.dtype, device=row.device)
        row.index_add_(0, ids, values)

    def _bitmask_for(self, rows: int) -> torch.Tensor:
        if self._bitmask is None or self._bitmask.shape[0] < rows:
            import xgrammar

            bitmask = xgrammar.allocate_token_bitmask(max(rows, 8), self.vocab_size)
            if self.device.type == "cuda":
                bitmask = bitmask.pin_memory()
            self._bitmask = bitmask
        return self._bitmask

    def _batch_matcher(self):
        if self._batch is None:
            import xgrammar

            self._batch = xgrammar.BatchGrammarMatcher()
        return self._batch
