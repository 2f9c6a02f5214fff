"""The engine's sampler as it was before sampling moved onto the device (issue 24): one
Python pass per row on the host, each row filtered and drawn on its own. Kept here, out of
the product, as the "before" of bench/engine.py's sampler section and as the reference the
device sampler's tests compare tokens against (tests/llm_svc/test_sampling.py).

Its seeded rows draw with torch.multinomial on a CPU generator seeded with the request's
seed, exactly as the engine did; the generators live here, keyed by sequence."""

from __future__ import annotations

import torch

from llm_svc.engine.sampling import SampledToken
from llm_svc.engine.sequence import Sequence, TokenLogprobs


def apply_penalties(row: torch.Tensor, seq: Sequence) -> None:
    """In place on one row of logits [vocab]."""
    params, vocab = seq.params, row.shape[0]
    if params.repetition_penalty != 1.0:
        ids = torch.tensor(seq.token_ids, device=row.device)
        seen = torch.unique(ids[(ids >= 0) & (ids < vocab)])
        values = row[seen]
        penalty = params.repetition_penalty
        row[seen] = torch.where(values > 0, values / penalty, values * penalty)
    if params.frequency_penalty != 0.0 or params.presence_penalty != 0.0:
        output = torch.tensor(seq.output_token_ids, dtype=torch.int64, device=row.device)
        counts = torch.bincount(output, minlength=vocab)[:vocab].to(row.dtype)
        row -= params.frequency_penalty * counts + params.presence_penalty * (counts > 0)


def filter_top_k_top_p(row: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """Logits [vocab] with everything outside top-k and the top-p nucleus set to -inf."""
    if 0 < top_k < row.shape[0]:
        kth = torch.topk(row, top_k).values[-1]
        row = row.masked_fill(row < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = torch.sort(row, descending=True)
        probs = torch.softmax(sorted_logits, dim=-1)
        drop = (torch.cumsum(probs, dim=-1) - probs) >= top_p
        drop[0] = False
        row = row.masked_fill(torch.zeros_like(drop).scatter(0, order, drop), float("-inf"))
    return row


class RowSampler:
    """Same call as llm_svc.engine.sampling.Sampler: (logits, seqs) → [SampledToken]."""

    def __init__(self, seed: int) -> None:
        self.generator = torch.Generator().manual_seed(seed)
        self.generators: dict[Sequence, torch.Generator] = {}

    def _generator(self, seq: Sequence) -> torch.Generator:
        if seq.params.seed is None:
            return self.generator
        if seq not in self.generators:
            self.generators[seq] = torch.Generator().manual_seed(seq.params.seed)
        return self.generators[seq]

    def __call__(self, logits: torch.Tensor, seqs: list[Sequence]) -> list[SampledToken]:
        logits = logits.float().cpu()
        raw = None
        if any(seq.params.logprobs is not None for seq in seqs):
            raw = torch.log_softmax(logits, dim=-1)
        if any(seq.params.has_penalties for seq in seqs):
            logits = logits.clone()
            for row, seq in zip(logits, seqs, strict=True):
                if seq.params.has_penalties:
                    apply_penalties(row, seq)
        greedy = logits.argmax(dim=-1).tolist()
        result = []
        for index, seq in enumerate(seqs):
            params = seq.params
            token = greedy[index]
            if not params.greedy:
                row = filter_top_k_top_p(
                    logits[index] / params.temperature, params.top_k, params.top_p
                )
                probs = torch.softmax(row, dim=-1)
                token = int(torch.multinomial(probs, 1, generator=self._generator(seq)))
            result.append(SampledToken(token, _logprobs(raw, index, token, params.logprobs)))
        return result


def _logprobs(raw, index: int, token: int, count: int | None) -> TokenLogprobs | None:
    if count is None:
        return None
    row = raw[index]
    top = []
    if count > 0:
        values, ids = torch.topk(row, count)
        top = [
            (token_id, value)
            for token_id, value in zip(ids.tolist(), values.tolist(), strict=True)
            if value != float("-inf")
        ]
    return TokenLogprobs(token, float(row[token]), top)
