"""Turns a step's logits into one token per sampling row, on the logits' device, as tensor
operations over all rows at once.

Order per row: penalties → (temperature 0: argmax) → temperature → top-k → top-p → min-p →
draw. The draw is the exponential race — token = argmax(probs / q), q ~ Exp(1) for each
vocabulary entry — which is how torch.multinomial draws one sample. A seeded request's q
comes from its own generator, one vocabulary-sized draw per step as multinomial drew it, so
its tokens are the row-by-row sampler's and do not depend on what else is in the batch;
the unseeded rows share one draw from the engine's generator. Log-probabilities come from
the logits as the model gave them, after only logit_bias and a grammar's mask (engine:
StepConstraints); tokens such a mask forbids are never listed among the top ones.

The host receives one packed tensor per step — the sampled ids, plus the requested
logprobs — when it calls `StepSample.resolve()`; until then the ids stay on the device,
where the next step's inputs can reference them.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from llm_svc.engine.sequence import Sequence, TokenLogprobs
from llm_svc.engine.transfer import DeviceToHost, to_device

# top_p given to the rows that do not filter by it: above any cumulative sum, even one that
# rounding lifts past 1, so such a row keeps every token exactly as without the filter.
TOP_P_OFF = 2.0


@dataclass
class SampledToken:
    token_id: int
    logprobs: TokenLogprobs | None


class StepSample:
    """One step's draws. `token_ids` [rows] (int64, on the device) is available at once;
    `resolve()` waits for the host copy of ids and logprobs (the step's one sync)."""

    def __init__(
        self, token_ids: torch.Tensor, raw: torch.Tensor | None, counts: list[int | None]
    ) -> None:
        self.token_ids = token_ids
        self._counts = counts
        self._top = 0
        payload = token_ids
        if raw is not None:
            # One copy: ids (exact in float64), the sampled tokens' logprobs, the top ones.
            self._top = max(count for count in counts if count is not None)
            parts = [token_ids.double(), raw.gather(1, token_ids[:, None])[:, 0].double()]
            if self._top:
                values, ids = torch.topk(raw, self._top, dim=-1)
                parts += [values.double().flatten(), ids.double().flatten()]
            payload = torch.cat(parts)
        self._transfer = DeviceToHost(payload)

    def resolve(self) -> list[SampledToken]:
        packed = self._transfer.wait().tolist()
        rows = len(self._counts)
        tokens = [int(token) for token in packed[:rows]]
        if len(packed) == rows:
            return [SampledToken(token, None) for token in tokens]
        chosen, top = packed[rows : 2 * rows], self._top
        values, ids = packed[2 * rows : 2 * rows + rows * top], packed[2 * rows + rows * top :]
        result = []
        for row, (token, count) in enumerate(zip(tokens, self._counts, strict=True)):
            logprobs = None
            if count is not None:
                first = row * top
                pairs = zip(ids[first : first + count], values[first : first + count], strict=True)
                best = [(int(i), v) for i, v in pairs if v != float("-inf")]
                logprobs = TokenLogprobs(token, chosen[row], best)
            result.append(SampledToken(token, logprobs))
        return result


def apply_penalties(logits: torch.Tensor, seqs: list[Sequence]) -> torch.Tensor:
    """A penalised copy of `logits` [rows, vocab] (row i is seqs[i]'s): repetition_penalty
    divides positive logits (multiplies negative ones) of every token seen in prompt or
    output; frequency / presence subtract count × f + p for tokens already generated.
    The histories go to the device as flat (row, id) pairs; the vocabulary is never looped."""
    rows, vocab = logits.shape
    device = logits.device
    repetition = np.ones(rows, dtype=np.float32)
    frequency = np.zeros(rows, dtype=np.float32)
    presence = np.zeros(rows, dtype=np.float32)
    seen_rows, seen_ids, out_rows, out_ids = [], [], [], []
    for row, seq in enumerate(seqs):
        params = seq.params
        if params.repetition_penalty != 1.0:
            # Prompts may hold multimodal sentinels (>= vocab): they are no token to penalise.
            ids = np.asarray(seq.token_ids, dtype=np.int64)
            ids = ids[(ids >= 0) & (ids < vocab)]
            seen_rows.append(np.full(len(ids), row, dtype=np.int64))
            seen_ids.append(ids)
            repetition[row] = params.repetition_penalty
        if params.frequency_penalty != 0.0 or params.presence_penalty != 0.0:
            ids = np.asarray(seq.output_token_ids, dtype=np.int64)
            out_rows.append(np.full(len(ids), row, dtype=np.int64))
            out_ids.append(ids)
            frequency[row] = params.frequency_penalty
            presence[row] = params.presence_penalty
    if seen_ids:
        index = (
            to_device(np.concatenate(seen_rows), device),
            to_device(np.concatenate(seen_ids), device),
        )
        seen = torch.zeros(rows, vocab, dtype=torch.bool, device=device)
        seen.index_put_(index, torch.ones((), dtype=torch.bool, device=device))
        penalty = to_device(repetition, device)[:, None]
        scaled = torch.where(logits > 0, logits / penalty, logits * penalty)
        logits = torch.where(seen, scaled, logits)
    if out_ids:
        index = (
            to_device(np.concatenate(out_rows), device),
            to_device(np.concatenate(out_ids), device),
        )
        counts = torch.zeros(rows, vocab, dtype=logits.dtype, device=device)
        counts.index_put_(index, torch.ones((), dtype=logits.dtype, device=device), accumulate=True)
        f = to_device(frequency, device)[:, None]
        p = to_device(presence, device)[:, None]
        logits = logits - (f * counts + p * (counts > 0))
    return logits


def filter_logits(
    logits: torch.Tensor,
    top_k: torch.Tensor | None = None,
    top_p: torch.Tensor | None = None,
    min_p: torch.Tensor | None = None,
) -> torch.Tensor:
    """`logits` [rows, vocab] with what each row's filters drop set to -inf. Per row:
    top_k [rows] (int64, the vocabulary size = off) keeps the k largest; top_p [rows]
    (TOP_P_OFF = off) the smallest nucleus reaching it; min_p [rows] (0 = off) the tokens
    at least min_p × the most likely one's probability, after top-k and top-p. None: no row
    uses that filter."""
    minus_inf = float("-inf")
    if top_k is not None or top_p is not None:
        sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
        if top_k is not None:
            kth = sorted_logits.gather(1, (top_k - 1)[:, None])
            logits = logits.masked_fill(logits < kth, minus_inf)
            sorted_logits = sorted_logits.masked_fill(sorted_logits < kth, minus_inf)
        if top_p is not None:
            probs = torch.softmax(sorted_logits, dim=-1)
            # Drop a token when the tokens ranked above it already reach top_p.
            drop = (torch.cumsum(probs, dim=-1) - probs) >= top_p[:, None]
            drop[:, 0] = False
            logits = logits.masked_fill(torch.zeros_like(drop).scatter(1, order, drop), minus_inf)
    if min_p is not None:
        probs = torch.softmax(logits, dim=-1)
        floor = probs.max(dim=-1, keepdim=True).values * min_p[:, None]
        logits = logits.masked_fill(probs < floor, minus_inf)
    return logits


class Sampler:
    """`sample(logits, seqs)` → StepSample; calling the sampler also resolves it.

    The engine's generator (seeded with `seed`) and each seeded request's own generator
    (made on first use, kept on the sequence) live on `device`."""

    def __init__(self, seed: int, device: torch.device) -> None:
        self.device = torch.device(device)
        self.generator = torch.Generator(self.device).manual_seed(seed)

    def __call__(self, logits: torch.Tensor, seqs: list[Sequence]) -> list[SampledToken]:
        return self.sample(logits, seqs).resolve()

    @torch.inference_mode()
    def sample(self, logits: torch.Tensor, seqs: list[Sequence]) -> StepSample:
        """`logits` [len(seqs), vocab], row i is seqs[i]'s."""
        logits = logits.float()
        counts = [seq.params.logprobs for seq in seqs]
        raw = None
        if any(count is not None for count in counts):
            raw = torch.log_softmax(logits, dim=-1)
        if any(seq.params.has_penalties for seq in seqs):
            logits = apply_penalties(logits, seqs)
        tokens = logits.argmax(dim=-1)
        drawing = [row for row, seq in enumerate(seqs) if not seq.params.greedy]
        if drawing and len(drawing) == len(seqs):
            tokens = self._draw(logits, seqs)
        elif drawing:
            rows = to_device(np.asarray(drawing, dtype=np.int64), logits.device)
            drawn = self._draw(logits.index_select(0, rows), [seqs[row] for row in drawing])
            tokens = tokens.index_copy(0, rows, drawn)
        return StepSample(tokens, raw, counts)

    def _draw(self, logits: torch.Tensor, seqs: list[Sequence]) -> torch.Tensor:
        """One token per row of `logits` [rows, vocab], every row sampling (temperature > 0)."""
        vocab = logits.shape[1]
        device = logits.device
        params = [seq.params for seq in seqs]
        settings = np.array(
            [
                [
                    p.temperature,
                    p.top_k if 0 < p.top_k < vocab else vocab,
                    p.top_p if p.top_p < 1.0 else TOP_P_OFF,
                    p.min_p,
                ]
                for p in params
            ],
            dtype=np.float32,
        )
        temperature, top_k, top_p, min_p = to_device(settings, device).unbind(1)
        uses_top_k = any(0 < p.top_k < vocab for p in params)
        logits = filter_logits(
            logits / temperature[:, None],
            top_k.long() if uses_top_k else None,
            top_p if any(p.top_p < 1.0 for p in params) else None,
            min_p if any(p.min_p > 0.0 for p in params) else None,
        )
        probs = torch.softmax(logits, dim=-1)
        return torch.argmax(probs / self._exponential(probs.shape, seqs), dim=-1)

    def _exponential(self, shape: torch.Size, seqs: list[Sequence]) -> torch.Tensor:
        """Exp(1) noise [rows, vocab]: a seeded row's from its own generator, the rest in one
        draw from the engine's."""
        noise = torch.empty(shape, device=self.device)
        free = [row for row, seq in enumerate(seqs) if seq.params.seed is None]
        if len(free) == len(seqs):
            return noise.exponential_(generator=self.generator)
        for row, seq in enumerate(seqs):
            if seq.params.seed is not None:
                noise[row].exponential_(generator=self._generator(seq))
        if free:
            rows = to_device(np.asarray(free, dtype=np.int64), self.device)
            shared = torch.empty((len(free), shape[1]), device=self.device)
            noise.index_copy_(0, rows, shared.exponential_(generator=self.generator))
        return noise

    def _generator(self, seq: Sequence) -> torch.Generator:
        if seq.generator is None:
            seq.generator = torch.Generator(self.device).manual_seed(seq.params.seed)
        return seq.generator
