"""Which decoding sequences get drafts this step, and how many; what came of them.

Rules (docs/design/engine.md, "Speculative decoding"):
- Only a sequence whose sampling the verifier reproduces exactly drafts: no grammar, no
  logit_bias, no penalties, no logprobs, and past its min_tokens (those act on one row's
  logits with the history before it; a draft row's history would include the drafts).
  Such a request decodes one token a step, exactly as without speculation.
- The whole batch decodes without drafts when `max_batch` or more sequences run: there a
  decode step is compute-bound and a rejected draft costs as much as a real token.
- A sequence whose recent acceptance (an exponential average of accepted / proposed, from
  0.5) falls below `min_acceptance` stops drafting for a back-off of steps that doubles
  each time it fails again (from 16 to 256 steps), then tries again; a good step halves
  the back-off.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

from llm_svc.engine.sequence import Sequence
from llm_svc.engine.spec.proposer import Proposer

# The weight of the newest step in a sequence's acceptance average.
AVERAGE_WEIGHT = 0.5
# The average a sequence starts from: one step that accepts nothing (0.25) pauses it at the
# default threshold (0.3), one that accepts half keeps it drafting.
FIRST_ACCEPTANCE = 0.5
FIRST_BACKOFF, MAX_BACKOFF = 16, 256


@dataclass
class SpecState:
    """A sequence's recent acceptance and back-off."""

    acceptance: float = FIRST_ACCEPTANCE
    backoff: int = 0  # steps of the current back-off (0: never backed off)
    paused: int = 0  # steps left without drafts
    backup: int | None = None  # hybrid models: the state slot kept during verification


@dataclass
class SpecStats:
    """Counters by method: tokens proposed, accepted, and verifications (chunks that
    carried drafts). Mean accepted length = (accepted + verifications) / verifications,
    the tokens a verification step yields."""

    proposed: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    accepted: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    verifications: dict[str, int] = field(default_factory=lambda: defaultdict(int))


def drafts_allowed(seq: Sequence) -> bool:
    """Whether the verifier reproduces `seq`'s sampling exactly (the first rule above)."""
    params = seq.params
    return (
        seq.grammar is None
        and not params.logit_bias
        and not params.has_penalties
        and params.logprobs is None
        and seq.num_output_tokens >= params.min_tokens
    )


class Speculator:
    def __init__(self, proposer: Proposer, k: int, min_acceptance: float, max_batch: int) -> None:
        self.proposer = proposer
        self.k = k
        self.min_acceptance = min_acceptance
        self.max_batch = max_batch
        self.stats = SpecStats()

    def propose(self, running: list[Sequence], max_model_len: int) -> None:
        """Give each running sequence that is decoding its drafts (no more than leave it
        within `max_tokens` and `max_model_len`)."""
        if len(running) >= self.max_batch:
            return
        for seq in running:
            if seq.num_uncomputed_tokens != 1 or seq.num_pending or not drafts_allowed(seq):
                continue
            state = seq.spec = seq.spec or SpecState()
            if state.paused:
                state.paused -= 1
                continue
            # The verification yields up to k + 1 tokens: never past the request's end.
            left = min(
                seq.params.max_tokens - seq.num_output_tokens,
                max_model_len - seq.num_tokens,
            )
            k = min(self.k, left - 1)
            if k <= 0:
                continue
            drafts = self.proposer.propose(seq, k)[:k]
            if drafts:
                seq.add_drafts(drafts)

    def record(self, seq: Sequence, proposed: int, accepted: int) -> None:
        """Count one verification of `seq` and update its acceptance and back-off."""
        name = self.proposer.name
        stats = self.stats
        stats.proposed[name] += proposed
        stats.accepted[name] += accepted
        stats.verifications[name] += 1
        state = seq.spec
        state.acceptance += AVERAGE_WEIGHT * (accepted / proposed - state.acceptance)
        if state.acceptance >= self.min_acceptance:
            state.backoff //= 2
            return
        state.backoff = min(MAX_BACKOFF, max(FIRST_BACKOFF, 2 * state.backoff))
        state.paused = state.backoff
        state.acceptance = self.min_acceptance  # one good step after the pause resumes it
