"""The SDPA backend's decode rows split by context length (attention/sdpa.py
`decode_groups`): the rule, and that two batches attend exactly as one does."""

from __future__ import annotations

import pytest
import torch

from llm_svc.engine.attention import sdpa
from llm_svc.engine.attention.sdpa import SdpaBackend, decode_groups
from tests.kernels.test_paged_attention import make_step


def test_rows_split_only_when_it_saves_a_quarter_of_the_padding():
    assert decode_groups([5]) == [[0]]
    assert decode_groups([100, 98, 97, 99]) == [[0, 1, 2, 3]]  # no padding to save
    # Three short rows beside one long one: 4 x 200 padded slots become 3 x 12 + 200.
    assert decode_groups([10, 200, 12, 8]) == [[0, 2, 3], [1]]
    # Every split saves under 25 %: one batch.
    assert decode_groups([150, 200, 160, 190]) == [[0, 1, 2, 3]]


def attend(seqs, window, monkeypatch, split: bool):
    saving = sdpa.SPLIT_SAVING if split else 2.0  # 2.0: no split can qualify
    monkeypatch.setattr(sdpa, "SPLIT_SAVING", saving)
    cache, meta, tokens, generator = make_step(seqs, 4, 200, 2, 16, torch.float32, seed=3)
    backend = SdpaBackend(cache)
    backend.plan(meta)
    q = torch.randn(tokens, 4, 16, generator=generator)
    k = torch.randn(tokens, 2, 16, generator=generator)
    v = torch.randn(tokens, 2, 16, generator=generator)
    return len(backend._decode), backend.forward(0, q, k, v, window=window)


@pytest.mark.parametrize("window", [None, 24])
def test_two_decode_batches_attend_as_one(window, monkeypatch):
    # Short and long decodes around a prefill chunk, so the groups are not contiguous.
    seqs = [(9, 1), (300, 1), (20, 6), (5, 1), (280, 1), (13, 1)]
    batches, split = attend(seqs, window, monkeypatch, split=True)
    assert batches == 2
    batches, whole = attend(seqs, window, monkeypatch, split=False)
    assert batches == 1
    torch.testing.assert_close(split, whole, rtol=1e-6, atol=1e-6)
