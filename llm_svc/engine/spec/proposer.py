"""The proposer interface: draft tokens for a decoding sequence, checked by the target."""

from __future__ import annotations

from abc import ABC, abstractmethod

from llm_svc.engine.sequence import Sequence


class Proposer(ABC):
    """Proposes up to `k` draft tokens to follow `seq`'s tokens (all read by the host).

    Every proposer here is deterministic given what it saw: its draft distribution q is a
    point mass on the proposed token, so the verifier's rejection sampling accepts a draft
    x with probability p(x) and resamples from p with x removed (verify.py). A proposer that
    has nothing to say returns [] and the sequence decodes one token that step."""

    name: str = ""

    @abstractmethod
    def propose(self, seq: Sequence, k: int) -> list[int]:
        """At most `k` draft token ids."""
