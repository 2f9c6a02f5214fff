"""Speculative decoding: proposers of draft tokens (n-gram prompt lookup; an oracle for
tests and the bench), their exact verification by the target model, and the rules for
who drafts (docs/design/engine.md, "Speculative decoding")."""

from __future__ import annotations

from llm_svc.engine.config import EngineConfig
from llm_svc.engine.spec.ngram import NgramProposer
from llm_svc.engine.spec.oracle import OracleProposer
from llm_svc.engine.spec.proposer import Proposer
from llm_svc.engine.spec.speculator import SpecState, SpecStats, Speculator
from llm_svc.engine.spec.verify import Verdict, Verification, rejection_sample, verify

PROPOSERS = {"ngram": NgramProposer}


def make_speculator(config: EngineConfig, vocab_size: int) -> Speculator | None:
    """The engine's speculator, or None when `num_speculative_tokens` is 0."""
    if not config.num_speculative_tokens:
        return None
    proposer = PROPOSERS[config.speculative_method](vocab_size)
    return Speculator(
        proposer,
        config.num_speculative_tokens,
        config.speculative_min_acceptance,
        config.speculative_max_batch,
    )


__all__ = [
    "NgramProposer",
    "OracleProposer",
    "Proposer",
    "SpecState",
    "SpecStats",
    "Speculator",
    "Verdict",
    "Verification",
    "make_speculator",
    "rejection_sample",
    "verify",
]
