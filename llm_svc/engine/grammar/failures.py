"""Failed compiles, remembered by the constraint's shape: its text with every number
replaced, and the largest number it held. A constraint of the same shape whose largest
number is at least a failed one's fails at once, so varying the numbers of a constraint
that timed out does not buy another compile; a smaller variant is still tried."""

from __future__ import annotations

import hashlib
import re
from collections import OrderedDict

from llm_svc.engine.grammar.spec import Constraint

_NUMBER = re.compile(r"\d+")


def shape(constraint: Constraint) -> tuple[str, int]:
    """(a hash of the text with its numbers replaced, the largest number in it, or 0)."""
    numbers = [int(text) for text in _NUMBER.findall(constraint.value)]
    text = _NUMBER.sub("#", constraint.value)
    digest = hashlib.sha256(f"{constraint.kind.value}\0{text}".encode()).hexdigest()
    return digest, max(numbers, default=0)


class FailureCache:
    """Bounded LRU of shape → (the least largest-number that failed, its error)."""

    def __init__(self, entries: int) -> None:
        self.entries = entries
        self._failed: OrderedDict[str, tuple[int, Exception]] = OrderedDict()

    def record(self, constraint: Constraint, error: Exception) -> None:
        key, largest = shape(constraint)
        known = self._failed.get(key)
        if known is None or largest < known[0]:
            self._failed[key] = (largest, error)
        self._failed.move_to_end(key)
        while len(self._failed) > self.entries:
            self._failed.popitem(last=False)

    def lookup(self, constraint: Constraint) -> Exception | None:
        """The error a constraint of this shape, with numbers no larger, failed with."""
        key, largest = shape(constraint)
        known = self._failed.get(key)
        if known is None or largest < known[0]:
            return None
        self._failed.move_to_end(key)
        return known[1]
