"""Routing regret: prompt tokens the chosen pod computed that another healthy pod held.

Precision (accuracy.py) judges only the prediction for the pod routing chose; a request sent
to a pod holding nothing, while another held its prefix, is invisible there. Regret sees it.
When routing chooses, it reads from the same index and by the same rule as its scorers
(`RoutingRequest.matched_blocks`) how many leading prompt tokens each healthy pod holds,
and keeps the deepest (`Basis.deepest`) beside the chosen pod's own (`Basis.predicted`).
When the chosen pod is not a deepest holder, it also keeps why the score passed them over:

    saturation    every deepest holder was dropped as saturated (a filter whose empty
                  answer is 429, e.g. not-saturated) or had no room (capacity admission)
    tie           a deepest holder's total score equalled the chosen pod's; the picker
                  went round the tied pods (a policy without scorers ties every pod)
    load          every deepest holder scored lower: its load outweighed its prefix

When the pod accepts, it answers with the tokens it held (`cached_tokens`, `actual`):

    regret = max(0, deepest - actual)         tokens

counted under one reason per request: the one above when routing passed a deeper holder
over, else `stale_index` (routing chose a pod it believed held the deepest prefix, and the
pod held less: events late or lost, a cache dropped unannounced). Pods outside the choice
(excluded after refusing this request, or dropped by a filter whose empty answer is 503,
e.g. healthy) are no alternative and count for nothing. The recording rule
`iris:gateway_routing_regret:ratio_rate5m` divides the regret tokens by the prompt tokens
of every accepted request.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass

from gateway import metrics

LOAD = "load"
SATURATION = "saturation"
TIE = "tie"
STALE_INDEX = "stale_index"
REASONS = (LOAD, SATURATION, TIE, STALE_INDEX)
NONE = "none"  # the histogram's label for a request that lost nothing
# The picker's tolerance: weighted sums that differ by float noise are a tie.
TIE_TOLERANCE = 1e-9

# Every reason's series exists from the start (at 0): the share is 0, never absent.
for _reason in REASONS:
    metrics.ROUTING_REGRET_TOKENS.labels(_reason)


@dataclass(frozen=True)
class Basis:
    """What routing knew when it chose: the deepest prefix (tokens) any healthy pod held by
    its index, the chosen pod's prediction, and why the score passed the deeper holders
    over (None when the chosen pod was one of them)."""

    deepest: int
    predicted: int
    passed_over: str | None = None


@dataclass(frozen=True)
class Regret:
    """One accepted request's regret: tokens lost and why (None when nothing was)."""

    tokens: int
    reason: str | None


def basis(
    chosen: str,
    held: Mapping[str, int],
    scores: Mapping[str, float],
    saturated: Collection[str],
) -> Basis:
    """Judge one choice. `held`: each healthy pod's predicted cached tokens (by address,
    the chosen pod included); `scores`: the total of each pod that was scored; `saturated`:
    the healthy pods dropped before scoring for load (filters answering 429, or no room)."""
    predicted = held.get(chosen, 0)
    deepest = max(held.values(), default=0)
    if predicted >= deepest:
        return Basis(deepest, predicted)
    holders = [pod for pod, tokens in held.items() if tokens == deepest]
    scored = [scores[pod] for pod in holders if pod not in saturated and pod in scores]
    if not scored:
        reason = SATURATION
    elif max(scored) >= scores[chosen] - TIE_TOLERANCE:
        reason = TIE
    else:
        reason = LOAD
    return Basis(deepest, predicted, reason)


def judge(choice: Basis, actual: int) -> Regret:
    """The regret of a request routed on `choice` whose pod held `actual` tokens."""
    tokens = max(0, choice.deepest - int(actual))
    if not tokens:
        return Regret(0, None)
    if choice.predicted < choice.deepest:
        return Regret(tokens, choice.passed_over)
    return Regret(tokens, STALE_INDEX)


def record(choice: Basis, actual: int, prompt_tokens: int) -> Regret:
    """Count one accepted request: its prompt tokens, and the regret it had."""
    outcome = judge(choice, actual)
    metrics.ROUTING_PROMPT_TOKENS.inc(prompt_tokens)
    metrics.ROUTING_REQUEST_REGRET_TOKENS.labels(outcome.reason or NONE).observe(outcome.tokens)
    if outcome.reason is not None:
        metrics.ROUTING_REGRET_TOKENS.labels(outcome.reason).inc(outcome.tokens)
    return outcome
