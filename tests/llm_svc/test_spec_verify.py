"""The rejection sampler on fixed distributions: accepted drafts and replacements together
are distributed as the target p, for a draft distribution q and for a point mass (the
proposers'), by a chi-square test at a fixed significance on fixed seeds; and n-gram lookup."""

from __future__ import annotations

import numpy as np
import torch

from llm_svc.engine.spec import rejection_sample
from llm_svc.engine.spec.ngram import lookup

SAMPLES = 20_000
# Chi-square critical values at significance 0.001, by degrees of freedom.
CRITICAL = {2: 13.816, 3: 16.266, 4: 18.467}
P = torch.tensor([0.1, 0.2, 0.3, 0.4, 0.0])
Q = torch.tensor([0.3, 0.3, 0.2, 0.1, 0.1])


def _outcomes(draft_probs: torch.Tensor | None, drafts: torch.Tensor, seed: int) -> np.ndarray:
    generator = torch.Generator().manual_seed(seed)
    probs = P.expand(SAMPLES, -1)
    uniform = torch.rand(SAMPLES, generator=generator)
    noise = torch.empty(SAMPLES, len(P)).exponential_(generator=generator)
    q = None if draft_probs is None else draft_probs.expand(SAMPLES, -1)
    accepted, replacement = rejection_sample(probs, drafts, uniform, noise, q)
    return torch.where(accepted, drafts, replacement).numpy()


def _chi_square(tokens: np.ndarray) -> tuple[float, int]:
    counts = np.bincount(tokens, minlength=len(P))
    expected = SAMPLES * P.numpy()
    assert counts[expected == 0].sum() == 0, "a token the target never draws"
    cells = expected > 0
    stat = float((((counts - expected) ** 2)[cells] / expected[cells]).sum())
    return stat, int(cells.sum()) - 1


def test_drafts_from_q_give_p():
    drafts = torch.multinomial(
        Q, SAMPLES, replacement=True, generator=torch.Generator().manual_seed(1)
    )
    stat, dof = _chi_square(_outcomes(Q, drafts, seed=2))
    assert stat < CRITICAL[dof], stat


def test_a_point_mass_draft_gives_p():
    # The proposers' case: q is a point mass on the draft (here always token 2, then 3).
    for token, seed in ((2, 3), (3, 4)):
        drafts = torch.full((SAMPLES,), token)
        stat, dof = _chi_square(_outcomes(None, drafts, seed=seed))
        assert stat < CRITICAL[dof], (token, stat)


def test_a_draft_the_target_is_sure_of_is_always_accepted():
    probs = torch.tensor([[0.0, 1.0, 0.0]])
    accepted, _ = rejection_sample(probs, torch.tensor([1]), torch.tensor([0.999]),
                                   torch.ones(1, 3))  # fmt: skip
    assert accepted.tolist() == [True]


def test_ngram_lookup_takes_the_latest_longest_match():
    tokens = np.array([1, 2, 3, 9, 1, 2, 3, 7, 8, 5, 2, 3])
    # "2 3" last followed by 7 (the latest match), then 8 5 2.
    assert lookup(tokens, 4) == [7, 8, 5, 2]
    # The longest n wins: "9 1 2" matches only once, earlier.
    assert lookup(np.array([9, 1, 2, 4, 1, 2, 6, 9, 1, 2]), 2) == [4, 1]
    assert lookup(np.array([1, 2, 3, 4]), 3) == []
