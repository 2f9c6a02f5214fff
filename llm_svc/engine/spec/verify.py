"""Acceptance of draft tokens against the target model's distributions, on the device.

Greedy rows accept a draft when it is the target's argmax. Sampling rows use rejection
sampling: a draft x drawn from q is accepted with probability min(1, p(x) / q(x)); on
rejection the token is drawn from the residual max(0, p - q), normalised. Accepted drafts
then a drawn token are together distributed exactly as tokens drawn from p one by one
(Leviathan et al., 2023). With a deterministic proposer q is a point mass: x is accepted
with probability p(x) and the residual is p without x.

A sequence's drafts d_0..d_{k-1} are verified on the target's rows 0..k-1 of its chunk (row
j predicts the token after d_{j-1}); the first rejected row j gives the replacement, and
if all are accepted the chunk's last row gives the bonus token, drawn by the ordinary
sampler. So one verification step yields 1 to k + 1 tokens.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from llm_svc.engine.sampling import Sampler
from llm_svc.engine.sequence import Sequence
from llm_svc.engine.transfer import DeviceToHost, to_device


def rejection_sample(
    probs: torch.Tensor,
    drafts: torch.Tensor,
    uniform: torch.Tensor,
    noise: torch.Tensor,
    draft_probs: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(accepted [R] bool, replacement [R] int64) for drafts [R] under target `probs`
    [R, V]; `uniform` [R] in [0, 1), `noise` [R, V] Exp(1); `draft_probs` [R, V] is q
    (None: a point mass on each draft). The replacement is drawn from the residual by the
    exponential race, which needs no normalising; it matters only where not accepted."""
    index = drafts[:, None]
    target = probs.gather(1, index)[:, 0]
    if draft_probs is None:
        proposed = torch.ones_like(target)
        residual = probs.scatter(1, index, 0.0)
    else:
        proposed = draft_probs.gather(1, index)[:, 0]
        residual = (probs - draft_probs).clamp_min(0.0)
    # u < p / q, written without a division (q(x) > 0 for a drawn x).
    accepted = uniform * proposed < target
    return accepted, torch.argmax(residual / noise, dim=-1)


@dataclass
class Verdict:
    """A sequence's verification: `accepted` drafts, then `replacement` (None: all were
    accepted, the bonus token is the ordinary sample)."""

    accepted: int
    replacement: int | None


class Verification:
    """One step's verifications on the device; `resolve()` reads them (one copy)."""

    def __init__(self, accepted: torch.Tensor, replacement: torch.Tensor, counts: list[int]):
        self.counts = counts
        self._transfer = DeviceToHost(torch.cat([accepted.long(), replacement]))

    def resolve(self) -> list[Verdict]:
        packed = self._transfer.wait().tolist()
        rows = len(packed) // 2
        accepted, replacement = packed[:rows], packed[rows:]
        verdicts, first = [], 0
        for count in self.counts:
            taken = 0
            while taken < count and accepted[first + taken]:
                taken += 1
            token = int(replacement[first + taken]) if taken < count else None
            verdicts.append(Verdict(taken, token))
            first += count
        return verdicts


@torch.inference_mode()
def verify(
    sampler: Sampler, logits: torch.Tensor, seqs: list[Sequence], drafts: list[list[int]]
) -> Verification:
    """`logits` [sum of len(drafts[i]), vocab]: seqs[i]'s draft rows, in order."""
    rows = [seq for seq, ids in zip(seqs, drafts, strict=True) for _ in ids]
    device = logits.device
    ids = to_device(np.asarray([t for ids in drafts for t in ids], dtype=np.int64), device)
    logits = logits.float()
    best = logits.argmax(dim=-1)
    accepted, replacement = best == ids, best
    drawing = [row for row, seq in enumerate(rows) if not seq.params.greedy]
    if drawing:
        index = to_device(np.asarray(drawing, dtype=np.int64), device)
        chosen = [rows[row] for row in drawing]
        probs = sampler.probs(logits.index_select(0, index), chosen)
        took, drawn = rejection_sample(
            probs, ids.index_select(0, index), sampler.uniform(chosen),
            sampler.exponential(probs.shape, chosen),
        )  # fmt: skip
        accepted = accepted.index_copy(0, index, took)
        replacement = replacement.index_copy(0, index, drawn)
    return Verification(accepted, replacement, [len(ids) for ids in drafts])
