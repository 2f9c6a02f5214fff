"""One request's grammar: waits for its compiled grammar, then a matcher that advances with
every token the request accepts."""

from __future__ import annotations

import concurrent.futures as cf
import time
from collections.abc import Callable

from llm_svc.engine.errors import InvalidRequestError
from llm_svc.engine.grammar.compiler import FIELD
from llm_svc.engine.grammar.spec import Constraint


class GrammarViolation(RuntimeError):
    """A sampled token the matcher refused (the mask should make this impossible)."""


class RequestGrammar:
    """`ready()` once compiled (then `start()`); `expired()` once it has waited past
    `timeout_s` for its grammar, in the queue and compiling together (the pool kills a
    compile at its last request's deadline, or at the compile limit if sooner). `release()`
    tells the pool this request no longer waits (once; the engine calls it when the
    request ends or expires).

    The matcher only ever advances: preemption keeps a sequence's output tokens and
    recomputes their KV, so the grammar state stays valid and needs neither rollback nor
    replay.

    `opens_after` (a reasoning request: the model's end-of-thought token id) keeps the
    grammar dormant, masking nothing, until the request samples that token: the thought
    is free text and the grammar shapes the answer after it."""

    def __init__(
        self,
        constraint: Constraint,
        future: cf.Future,
        timeout_s: float,
        workers_since: Callable[[], float | None] = time.monotonic,
        opens_after: int | None = None,
        release: Callable[[], None] | None = None,
    ) -> None:
        self.constraint = constraint
        self.future = future
        self.timeout_s = timeout_s
        self.submitted = time.monotonic()
        # When the pool's first worker was ready (None: still starting): the wait for a
        # slot is counted from then, so a pod's cold start fails no request.
        self.workers_since = workers_since
        self.matcher = None
        self._release = release
        self.opens_after = opens_after

    @property
    def active(self) -> bool:
        """Whether the grammar masks this step's token (not while the thought runs)."""
        return self.opens_after is None

    def ready(self) -> bool:
        # A cancelled future is a job the pool dropped: nobody waited for it any more.
        return self.future.done() and not self.future.cancelled()

    def expired(self) -> bool:
        if self.ready():
            return False
        since = self.workers_since()
        return since is not None and time.monotonic() > max(self.submitted, since) + self.timeout_s

    def timeout_error(self) -> InvalidRequestError:
        if self.future.running():
            reason = "was not compiled within the limit of {:g} s (waiting and compiling; "
        else:
            reason = "found no free compile slot within the limit of {:g} s ("
        return InvalidRequestError(
            FIELD,
            self.constraint.describe(),
            reason.format(self.timeout_s) + "the pod's grammar compilers are busy)",
        )

    def release(self) -> None:
        release, self._release = self._release, None
        if release is not None:
            release()

    def start(self) -> None:
        """Make the matcher; raises the compile's InvalidRequestError if it failed."""
        import xgrammar

        self.matcher = xgrammar.GrammarMatcher(self.future.result())

    def accept(self, token_id: int) -> None:
        if self.opens_after is not None:  # still thinking: the thought is not the grammar's
            if token_id == self.opens_after:
                self.opens_after = None
            return
        if not self.matcher.accept_token(token_id):
            raise GrammarViolation(f"token {token_id} is not allowed by the request's grammar")

    @property
    def terminated(self) -> bool:
        """The grammar is complete and its stop token accepted: nothing more may follow."""
        return self.active and self.matcher is not None and self.matcher.is_terminated()
