"""Prompt lookup: the tokens that followed the latest earlier occurrence of the sequence's
last n tokens (n from `max_n` down to `min_n`), in its prompt and output alike."""

from __future__ import annotations

import numpy as np

from llm_svc.engine.sequence import Sequence
from llm_svc.engine.spec.proposer import Proposer


def lookup(tokens: np.ndarray, k: int, min_n: int = 2, max_n: int = 4) -> list[int]:
    """Up to `k` tokens that followed the latest earlier match of `tokens`' last n, for the
    largest n in [min_n, max_n] that has one; [] if none does."""
    length = len(tokens)
    for n in range(min(max_n, length - 1), min_n - 1, -1):
        tail = tokens[length - n :]
        # Windows of n over tokens[:-1], so a match is never the tail itself.
        windows = np.lib.stride_tricks.sliding_window_view(tokens[: length - 1], n)
        hits = np.flatnonzero((windows == tail).all(axis=1))
        if len(hits):
            start = int(hits[-1]) + n
            return tokens[start : start + k].tolist()
    return []


class NgramProposer(Proposer):
    """Prompt lookup for any model: no weights, no device work. A prompt's multimodal
    sentinels (ids past the vocabulary) are never proposed: drafts stop before one."""

    name = "ngram"

    def __init__(self, vocab_size: int, min_n: int = 2, max_n: int = 4) -> None:
        self.vocab_size = vocab_size
        self.min_n, self.max_n = min_n, max_n

    def propose(self, seq: Sequence, k: int) -> list[int]:
        tokens = np.asarray(seq.token_ids, dtype=np.int64)
        drafts = lookup(tokens, k, self.min_n, self.max_n)
        for index, token in enumerate(drafts):
            if not 0 <= token < self.vocab_size:
                return drafts[:index]
        return drafts
