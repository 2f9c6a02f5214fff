"""Failed compiles, each remembered for a bounded time (`ttl_s`).

A plain error (xgrammar refused the constraint) is remembered by the constraint's exact,
normalised text only: its verdict says nothing of a neighbour that differs in a number.

A compile that ran out of time is also remembered by its *shape*: its text with every
number replaced, and the numbers in order. A constraint of the same shape whose every
number is at least the failed one's in the same place fails at once, so raising the counts
of a constraint that timed out does not buy another compile; any smaller variant is tried.
The time limit makes a timeout caused by a busy machine cost that constraint minutes, not
the pod's lifetime.
"""

from __future__ import annotations

import hashlib
import re
import time
from collections import OrderedDict
from collections.abc import Callable

from llm_svc.engine.grammar.spec import Constraint

_NUMBER = re.compile(r"\d+")
_PER_SHAPE = 4  # failed number sets kept per shape (the newest)


def shape(constraint: Constraint) -> tuple[str, tuple[int, ...]]:
    """(a hash of the kind and the text with its numbers replaced, the numbers in order)."""
    numbers = tuple(int(text) for text in _NUMBER.findall(constraint.value))
    text = _NUMBER.sub("#", constraint.value)
    digest = hashlib.sha256(f"{constraint.kind.value}\0{text}".encode()).hexdigest()
    return digest, numbers


def _at_least(numbers: tuple[int, ...], failed: tuple[int, ...]) -> bool:
    return all(mine >= theirs for mine, theirs in zip(numbers, failed, strict=True))


class FailureCache:
    """Bounded LRUs: exact key → (expiry, error), and shape → [(expiry, numbers, error)]."""

    def __init__(
        self, entries: int, ttl_s: float, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.entries = entries
        self.ttl_s = ttl_s
        self._clock = clock
        self._exact: OrderedDict[str, tuple[float, Exception]] = OrderedDict()
        self._shapes: OrderedDict[str, list[tuple[float, tuple[int, ...], Exception]]] = (
            OrderedDict()
        )

    def record(self, constraint: Constraint, error: Exception, *, by_shape: bool) -> None:
        """Remember a failure; `by_shape` only for a compile that ran out of time."""
        expires = self._clock() + self.ttl_s
        self._exact[constraint.key] = (expires, error)
        self._exact.move_to_end(constraint.key)
        if by_shape:
            key, numbers = shape(constraint)
            kept = self._shapes.get(key, [])
            self._shapes[key] = [*kept, (expires, numbers, error)][-_PER_SHAPE:]
            self._shapes.move_to_end(key)
        for table in (self._exact, self._shapes):
            while len(table) > self.entries:
                table.popitem(last=False)

    def lookup(self, constraint: Constraint) -> Exception | None:
        """The error this constraint, or a larger one of its shape that timed out, failed
        with (within the time limit); None if it should be compiled."""
        now = self._clock()
        known = self._exact.get(constraint.key)
        if known is not None:
            if known[0] > now:
                return known[1]
            del self._exact[constraint.key]
        key, numbers = shape(constraint)
        kept = [entry for entry in self._shapes.get(key, []) if entry[0] > now]
        if not kept:
            self._shapes.pop(key, None)
            return None
        self._shapes[key] = kept
        for _, failed, error in kept:
            if _at_least(numbers, failed):
                self._shapes.move_to_end(key)
                return error
        return None
