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
    # Whether the engine hands over the target's last hidden states (`observe`).
    needs_hidden: bool = False

    @abstractmethod
    def propose(self, seq: Sequence, k: int) -> list[int]:
        """At most `k` draft token ids."""

    def forget(self, seq: Sequence) -> None:  # noqa: B027 (a hook: most keep nothing)
        """`seq` has finished (or was aborted or failed): a proposer that keeps state per
        sequence drops its."""

    def observe(self, seq: Sequence, start: int, hidden) -> None:  # noqa: B027
        """Only if `needs_hidden`: the target's last hidden states [n, H] of `seq`'s
        positions [start, start + n), as a step computed them (a view of the step's
        tensor: a proposer copies what it keeps)."""
