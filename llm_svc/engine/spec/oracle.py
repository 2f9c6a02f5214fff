"""A proposer for tests and bench/engine.py only: it knows each request's true continuation
and proposes each next token of it with probability `p` (else a wrong token), so the
verifier's cost and gain can be measured at a chosen acceptance. Never served."""

from __future__ import annotations

import random

from llm_svc.engine.sequence import Sequence
from llm_svc.engine.spec.proposer import Proposer


class OracleProposer(Proposer):
    name = "oracle"

    def __init__(self, continuations: dict[str, list[int]], p: float, vocab_size: int,
                 seed: int = 0) -> None:  # fmt: skip
        self.continuations = continuations  # request id -> its output without speculation
        self.p = p
        self.vocab_size = vocab_size
        self.random = random.Random(seed)

    def propose(self, seq: Sequence, k: int) -> list[int]:
        truth = self.continuations.get(seq.request_id, [])
        done = seq.num_output_tokens
        drafts = []
        for token in truth[done : done + k]:
            right = self.random.random() < self.p
            drafts.append(token if right else (token + 1) % self.vocab_size)
        return drafts
