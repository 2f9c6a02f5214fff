"""Measured throughputs a pod reports to the gateway (GetLoad), for its time estimates.

A `Rate` is a moving average of an amount per second (tokens, bytes) over the operations
that moved it: the amounts and the seconds are averaged apart and divided, so a tiny
operation (a one-page load, whose fixed cost dominates) weighs what it moved, not as much as
a large one. 0 until the first observation: the gateway then uses its own default.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Rate:
    """`observe(amount, seconds)` per operation; `per_second` the average rate."""

    weight: float = 0.1  # of each new observation
    _amount: float = 0.0
    _seconds: float = 0.0

    def observe(self, amount: float, seconds: float) -> None:
        if amount <= 0 or seconds <= 0:
            return
        if self._seconds == 0.0:
            self._amount, self._seconds = float(amount), float(seconds)
            return
        keep = 1.0 - self.weight
        self._amount = keep * self._amount + self.weight * amount
        self._seconds = keep * self._seconds + self.weight * seconds

    @property
    def per_second(self) -> float:
        return self._amount / self._seconds if self._seconds else 0.0
