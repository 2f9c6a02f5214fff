"""Turns a step's logits into one token per sampling sequence.

Order per row: penalties → (temperature 0: argmax) → temperature → top-k → top-p → draw
with the request's own generator when it has a seed (so its tokens do not depend on what
else is in the batch), else with the engine's. Log-probabilities come from the logits as
the model gave them, after only logit_bias and a grammar's mask (engine: StepConstraints);
tokens such a mask forbids are never listed among the top ones.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from llm_svc.engine.sequence import Sequence, TokenLogprobs


@dataclass
class SampledToken:
    token_id: int
    logprobs: TokenLogprobs | None


def apply_penalties(row: torch.Tensor, seq: Sequence) -> None:
    """In place on one row of logits [vocab]."""
    params, vocab = seq.params, row.shape[0]
    if params.repetition_penalty != 1.0:
        # Prompts may hold multimodal sentinels (>= vocab): they are no token to penalise.
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
        # Drop a token when the tokens ranked above it already reach top_p.
        drop = (torch.cumsum(probs, dim=-1) - probs) >= top_p
        drop[0] = False
        row = row.masked_fill(torch.zeros_like(drop).scatter(0, order, drop), float("-inf"))
    return row


class Sampler:
    def __init__(self, seed: int) -> None:
        self.generator = torch.Generator().manual_seed(seed)

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
                generator = seq.generator or self.generator
                token = int(torch.multinomial(probs, 1, generator=generator))
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
