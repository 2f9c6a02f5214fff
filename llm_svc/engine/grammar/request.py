"""One request's grammar: waits for its compiled grammar, then a matcher that advances with
every token the request accepts."""

from __future__ import annotations

import concurrent.futures as cf
import time

from llm_svc.engine.errors import InvalidRequestError
from llm_svc.engine.grammar.compiler import FIELD
from llm_svc.engine.grammar.spec import Constraint


class GrammarViolation(RuntimeError):
    """A sampled token the matcher refused (the mask should make this impossible)."""


class RequestGrammar:
    """`ready()` once compiled (then `start()`); `expired()` past the compile deadline.

    The matcher only ever advances: preemption keeps a sequence's output tokens and
    recomputes their KV, so the grammar state stays valid and needs neither rollback nor
    replay."""

    def __init__(self, constraint: Constraint, future: cf.Future, timeout_s: float) -> None:
        self.constraint = constraint
        self.future = future
        self.timeout_s = timeout_s
        self.deadline = time.monotonic() + timeout_s
        self.matcher = None

    def ready(self) -> bool:
        return self.future.done()

    def expired(self) -> bool:
        return not self.future.done() and time.monotonic() > self.deadline

    def timeout_error(self) -> InvalidRequestError:
        return InvalidRequestError(
            FIELD,
            self.constraint.describe(),
            f"did not compile within the limit of {self.timeout_s:g} s (too large or complex)",
        )

    def start(self) -> None:
        """Make the matcher; raises the compile's InvalidRequestError if it failed."""
        import xgrammar

        self.matcher = xgrammar.GrammarMatcher(self.future.result())

    def accept(self, token_id: int) -> None:
        if not self.matcher.accept_token(token_id):
            raise GrammarViolation(f"token {token_id} is not allowed by the request's grammar")

    @property
    def terminated(self) -> bool:
        """The grammar is complete and its stop token accepted: nothing more may follow."""
        return self.matcher is not None and self.matcher.is_terminated()
