"""Turns a step's logits into one token per sampling row, on the logits' device, as tensor
operations over all rows at once.

Order per row: penalties → (temperature 0: argmax) → temperature → top-k → top-p → min-p →
draw; each stage runs, batched, on the rows that use it. The draw is the exponential race —
token = argmax(probs / q), q ~ Exp(1) for each vocabulary entry — which is how
torch.multinomial draws one sample. A seeded request's q comes from its own generator, one
vocabulary-sized draw per step as multinomial drew it, so its tokens are the row-by-row
sampler's and do not depend on what else is in the batch; the unseeded rows share one draw
from the engine's generator. Log-probabilities come from the logits as the model gave them,
after only logit_bias and a grammar's mask (engine: StepConstraints); tokens such a mask
forbids are never listed among the top ones.

The host receives one packed tensor per step — the sampled ids, plus the requested
logprobs — when it calls `StepSample.resolve()`; until then the ids stay on the device,
where the next step's inputs can reference them.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from llm_svc.engine.pending import PendingTokens
from llm_svc.engine.sequence import Sequence, TokenLogprobs
from llm_svc.engine.transfer import DeviceToHost, to_device


@dataclass
class SampledToken:
    token_id: int
    logprobs: TokenLogprobs | None


def _take(values: torch.Tensor, rows: list[int]) -> torch.Tensor:
    if len(rows) == values.shape[0]:
        return values
    return values.index_select(0, to_device(np.asarray(rows, dtype=np.int64), values.device))


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


def apply_penalties(
    logits: torch.Tensor, seqs: list[Sequence], pending: PendingTokens | None = None
) -> torch.Tensor:
    """A penalised copy of `logits` [rows, vocab] (row i is seqs[i]'s): repetition_penalty
    divides positive logits (multiplies negative ones) of every token seen in prompt or
    output; frequency / presence subtract count × f + p for tokens already generated.
    The histories go to the device as flat (row, id) pairs; the vocabulary is never looped.
    A sequence's token still `pending` on the device joins its history there."""
    rows, vocab = logits.shape
    device = logits.device
    repetition = np.ones(rows, dtype=np.float32)
    frequency = np.zeros(rows, dtype=np.float32)
    presence = np.zeros(rows, dtype=np.float32)
    seen, counted = _History(device, pending), _History(device, pending)
    for row, seq in enumerate(seqs):
        params = seq.params
        if params.repetition_penalty != 1.0:
            # Prompts may hold multimodal sentinels (>= vocab): they are no token to
            # penalise; PLACEHOLDERs (< 0) are taken from the device.
            ids = np.asarray(seq.token_ids, dtype=np.int64)
            seen.add(row, seq, ids[(ids >= 0) & (ids < vocab)])
            repetition[row] = params.repetition_penalty
        if params.frequency_penalty != 0.0 or params.presence_penalty != 0.0:
            counted.add(row, seq, np.asarray(seq.output_token_ids, dtype=np.int64))
            frequency[row] = params.frequency_penalty
            presence[row] = params.presence_penalty
    if seen:
        mask = torch.zeros(rows, vocab, dtype=torch.bool, device=device)
        mask.index_put_(seen.index(), torch.ones((), dtype=torch.bool, device=device))
        penalty = to_device(repetition, device)[:, None]
        scaled = torch.where(logits > 0, logits / penalty, logits * penalty)
        logits = torch.where(mask, scaled, logits)
    if counted:
        counts = torch.zeros(rows, vocab, dtype=logits.dtype, device=device)
        one = torch.ones((), dtype=logits.dtype, device=device)
        counts.index_put_(counted.index(), one, accumulate=True)
        f = to_device(frequency, device)[:, None]
        p = to_device(presence, device)[:, None]
        logits = logits - (f * counts + p * (counts > 0))
    return logits


class _History:
    """(row, token id) pairs of the rows one penalty concerns: the ids the host holds, and
    the sequences' pending tokens, gathered on the device."""

    def __init__(self, device: torch.device, pending: PendingTokens | None) -> None:
        self.device, self.pending = device, pending
        self.rows: list[np.ndarray] = []
        self.ids: list[np.ndarray] = []
        self.late_rows: list[int] = []
        self.late_seqs: list[Sequence] = []

    def __bool__(self) -> bool:
        return bool(self.rows)

    def add(self, row: int, seq: Sequence, ids: np.ndarray) -> None:
        self.rows.append(np.full(len(ids), row, dtype=np.int64))
        self.ids.append(ids)
        if seq.num_pending:
            self.late_rows.append(row)
            self.late_seqs.append(seq)

    def index(self) -> tuple[torch.Tensor, torch.Tensor]:
        rows = np.concatenate(self.rows + [np.asarray(self.late_rows, dtype=np.int64)])
        ids = to_device(np.concatenate(self.ids), self.device)
        if self.late_seqs:
            assert self.pending is not None, "a placeholder without the step that samples it"
            ids = torch.cat([ids, self.pending.gather(self.late_seqs)])
        return to_device(rows, self.device), ids


def top_k_filter(logits: torch.Tensor, top_k: torch.Tensor, widest: int) -> torch.Tensor:
    """Each row's `top_k` [rows] (int64, in [1, widest]) largest logits kept, the rest -inf:
    one topk of `widest` (the largest k the host knows of), not a sort of the vocabulary."""
    values = torch.topk(logits, widest, dim=-1).values
    kth = values.gather(1, (top_k - 1)[:, None])
    return logits.masked_fill(logits < kth, float("-inf"))


def top_p_filter(
    logits: torch.Tensor, top_p: torch.Tensor, width: int | None = None
) -> torch.Tensor:
    """Each row's smallest nucleus reaching `top_p` [rows] kept, the rest -inf. `width`:
    every row has at most that many finite logits (top-k ran), so only those are sorted."""
    if width is None:
        sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
    else:
        sorted_logits, order = torch.topk(logits, width, dim=-1)
    probs = torch.softmax(sorted_logits, dim=-1)
    # Drop a token when the tokens ranked above it already reach top_p.
    drop = (torch.cumsum(probs, dim=-1) - probs) >= top_p[:, None]
    drop[:, 0] = False
    dropped = torch.zeros(logits.shape, dtype=torch.bool, device=logits.device)
    return logits.masked_fill(dropped.scatter_(1, order, drop), float("-inf"))


def min_p_filter(logits: torch.Tensor, min_p: torch.Tensor) -> torch.Tensor:
    """Each row's tokens at least `min_p` [rows] × as likely as its most likely one kept."""
    # p / p_max >= min_p  ⇔  logit >= max logit + log(min_p): no softmax needed.
    floor = logits.max(dim=-1, keepdim=True).values + torch.log(min_p)[:, None]
    return logits.masked_fill(logits < floor, float("-inf"))


def on_rows(fn, tensor: torch.Tensor, rows: list[int], *args, in_place: bool = False):
    """`fn(tensor[rows], *args)` written back into `tensor`'s rows (into `tensor` itself
    when `in_place`); `fn(tensor, *args)` when `rows` are all of them. Work that only some
    rows need is done on those alone."""
    if len(rows) == tensor.shape[0]:
        return fn(tensor, *args)
    index = to_device(np.asarray(rows, dtype=np.int64), tensor.device)
    result = fn(tensor.index_select(0, index), *args)
    if in_place:
        return tensor.index_copy_(0, index, result)
    return tensor.index_copy(0, index, result)


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
    def sample(
        self, logits: torch.Tensor, seqs: list[Sequence], pending: PendingTokens | None = None
    ) -> StepSample:
        """`logits` [len(seqs), vocab], row i is seqs[i]'s. `pending`: the tokens of the
        step before, not read by the host yet (their sequences' penalties count them)."""
        logits = logits.float()
        counts = [seq.params.logprobs for seq in seqs]
        raw = None
        if any(count is not None for count in counts):
            raw = torch.log_softmax(logits, dim=-1)
        penalised = [row for row, seq in enumerate(seqs) if seq.params.has_penalties]
        if penalised:
            chosen = [seqs[row] for row in penalised]
            logits = on_rows(apply_penalties, logits, penalised, chosen, pending)
        drawing = [row for row, seq in enumerate(seqs) if not seq.params.greedy]
        if not drawing:
            tokens = logits.argmax(dim=-1)
        elif len(drawing) == len(seqs):
            tokens = self._draw(logits, seqs)
        else:
            greedy = [row for row, seq in enumerate(seqs) if seq.params.greedy]
            tokens = torch.empty(len(seqs), dtype=torch.int64, device=logits.device)
            for rows, pick in ((greedy, self._argmax), (drawing, self._draw)):
                index = to_device(np.asarray(rows, dtype=np.int64), logits.device)
                tokens.index_copy_(
                    0, index, pick(logits.index_select(0, index), [seqs[r] for r in rows])
                )
        return StepSample(tokens, raw, counts)

    @staticmethod
    def _argmax(logits: torch.Tensor, seqs: list[Sequence]) -> torch.Tensor:
        return logits.argmax(dim=-1)

    def _draw(self, logits: torch.Tensor, seqs: list[Sequence]) -> torch.Tensor:
        """One token per row of `logits` [rows, vocab], every row sampling (temperature > 0)."""
        probs = self.probs(logits, seqs)
        return torch.argmax(probs / self._exponential(probs.shape, seqs), dim=-1)

    def probs(self, logits: torch.Tensor, seqs: list[Sequence]) -> torch.Tensor:
        """The distribution each row draws from [rows, vocab]: temperature, then top-k,
        top-p and min-p (every row sampling; penalties already applied)."""
        vocab = logits.shape[1]
        params = [seq.params for seq in seqs]
        settings = np.array(
            [[p.temperature, p.top_k, p.top_p, p.min_p] for p in params], dtype=np.float32
        ).reshape(len(params), 4)
        temperature, top_k, top_p, min_p = to_device(settings, logits.device).unbind(1)
        logits = logits / temperature[:, None]
        # Each filter on the rows that use it, in this order; a row outside keeps its logits.
        by_k = [row for row, p in enumerate(params) if 0 < p.top_k < vocab]
        if by_k:
            widest = max(params[row].top_k for row in by_k)
            values = _take(top_k.long(), by_k)
            logits = on_rows(top_k_filter, logits, by_k, values, widest, in_place=True)
        # A row's nucleus lies within its top-k: rows with both sort only `widest` values.
        with_k = set(by_k)
        by_p = [row for row, p in enumerate(params) if p.top_p < 1.0 and row not in with_k]
        by_kp = [row for row, p in enumerate(params) if p.top_p < 1.0 and row in with_k]
        for rows, width in ((by_p, None), (by_kp, widest if by_kp else None)):
            if rows:
                values = _take(top_p, rows)
                logits = on_rows(top_p_filter, logits, rows, values, width, in_place=True)
        by_min_p = [row for row, p in enumerate(params) if p.min_p > 0.0]
        if by_min_p:
            values = _take(min_p, by_min_p)
            logits = on_rows(min_p_filter, logits, by_min_p, values, in_place=True)
        return torch.softmax(logits, dim=-1)

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

    def uniform(self, seqs: list[Sequence]) -> torch.Tensor:
        """U[0, 1) [rows], row i from seqs[i]'s generator if seeded, else the engine's."""
        values = torch.empty(len(seqs), device=self.device)
        for row, seq in enumerate(seqs):
            generator = self.generator if seq.params.seed is None else self._generator(seq)
            values[row : row + 1].uniform_(generator=generator)
        return values

    def exponential(self, shape: torch.Size, seqs: list[Sequence]) -> torch.Tensor:
        """Exp(1) noise [rows, vocab] as the draw takes it (seeded rows from their own)."""
        return self._exponential(shape, seqs)

    def _generator(self, seq: Sequence) -> torch.Generator:
        if seq.generator is None:
            seq.generator = torch.Generator(self.device).manual_seed(seq.params.seed)
        return seq.generator
