"""What this gateway has placed on a pod and not yet seen finish.

The pods' own load (GetLoad) arrives every poll interval; requests routed in between would
all see the same stale numbers and pile onto one pod. So routing also counts its own
placements, the moment it makes them: a request is *prefilling* from the routing decision
until its first token (carrying the prompt tokens the pod did not hold when it was routed,
which the pod computes before that token), then *decoding* until its stream ends.

A pod's GetLoad answer also counts requests from other gateways. `observe` keeps what the
answer shows beyond this gateway's own placements: the polled numbers themselves go stale
between polls (a request that just finished still shows as waiting), and taken at face
value they sent requests away from the pod that held their prefix. The estimate errs low:
our placements count in full even while a request is still being encoded or is part way
through its prefill, so they can hide some of the others' load, never add to it.

The ledger also measures how fast the pod drains what is placed on it (`DrainMeter`):
prefill tokens reaching their first token, and streams completing, per second over the
last few seconds; and how long each placement waited for its first token. Admission
(gateway/routing/capacity.py) sets each pod's limit from those waits and turns the drain
rates into Retry-After.

Every placement is a `Ticket`, closed exactly once whatever happens to the request. A ticket
that never reached its first token within `stale_after_s` (a start that died between
routing and dispatch) stops counting, so a leaked ticket cannot skew routing for long.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass

STALE_AFTER_S = 120.0
DRAIN_WINDOW_S = 10.0
FIRST_TOKEN_SAMPLES = 1024


class DrainMeter:
    """Amounts over time; `rate()` is their sum per second over the last `window_s`."""

    def __init__(self, window_s: float = DRAIN_WINDOW_S, clock=time.monotonic) -> None:
        self._window_s = window_s
        self._clock = clock
        self._samples: deque[tuple[float, float]] = deque()
        self._total = 0.0

    def add(self, amount: float) -> None:
        self._samples.append((self._clock(), float(amount)))
        self._total += amount

    def rate(self) -> float | None:
        """Per second over the window (at least 1 s of it), or None with nothing in it."""
        now = self._clock()
        while self._samples and self._samples[0][0] < now - self._window_s:
            self._total -= self._samples.popleft()[1]
        if not self._samples:
            return None
        span = min(self._window_s, max(1.0, now - self._samples[0][0]))
        return self._total / span


@dataclass(frozen=True)
class InflightView:
    """A snapshot of one pod's placements by this gateway, and the load beyond them that
    the pod's last GetLoad answer showed (other gateways' requests)."""

    prefilling: int = 0  # requests routed here, no token yet
    prefill_tokens: int = 0  # prompt tokens those requests still need computed
    decoding: int = 0  # requests streaming tokens
    others_running: int = 0  # running requests beyond ours, at the last poll
    others_prefill_tokens: int = 0  # pending prefill beyond ours, at the last poll

    @property
    def requests(self) -> int:
        return self.prefilling + self.decoding


class Ticket:
    """One placement. `first_token()` moves it from prefilling to decoding; `close()` ends
    it (both idempotent, in any order)."""

    __slots__ = ("_ledger", "prefill_tokens", "opened_at", "decoding", "closed")

    def __init__(self, ledger: InflightLedger, prefill_tokens: int, now: float) -> None:
        self._ledger = ledger
        self.prefill_tokens = prefill_tokens
        self.opened_at = now
        self.decoding = False
        self.closed = False

    def first_token(self) -> None:
        if not self.closed and not self.decoding:
            self.decoding = True
            self._ledger.prefilled.add(self.prefill_tokens)
            self._ledger.first_token_waits.append(self._ledger._clock() - self.opened_at)
            self._ledger.first_tokens += 1

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self._ledger._tickets.discard(self)
            if self.decoding:  # a stream that ran: the pod drained one request
                self._ledger.completed.add(1)


class InflightLedger:
    """One pod's open tickets, and how fast the pod drains them: `prefilled` (prompt tokens
    per second reaching a first token), `completed` (streams per second), and
    `first_token_waits` (seconds from routing to the first token, the latest ones)."""

    def __init__(self, stale_after_s: float = STALE_AFTER_S, clock=time.monotonic) -> None:
        self._tickets: set[Ticket] = set()
        self.prefilled = DrainMeter(clock=clock)
        self.completed = DrainMeter(clock=clock)
        self.first_token_waits: deque[float] = deque(maxlen=FIRST_TOKEN_SAMPLES)
        self.first_tokens = 0  # all-time count (the deque keeps the latest)
        self._stale_after_s = stale_after_s
        self._clock = clock
        self._others = (0, 0)  # (running, prefill tokens) beyond ours at the last poll

    def open(self, prefill_tokens: int) -> Ticket:
        ticket = Ticket(self, max(0, int(prefill_tokens)), self._clock())
        self._tickets.add(ticket)
        return ticket

    def observe(self, running: int, prefill_tokens: int, before: InflightView) -> None:
        """Record a GetLoad answer (running requests, pending prefill tokens); `before` is
        `view()` from when it was asked for. Our placements are taken at the larger of then
        and now, so a request of ours that ended in between is not read as someone else's."""
        after = self.view()
        self._others = (
            max(0, running - max(before.requests, after.requests)),
            max(0, prefill_tokens - max(before.prefill_tokens, after.prefill_tokens)),
        )

    def view(self) -> InflightView:
        now = self._clock()
        prefilling = prefill_tokens = decoding = 0
        for ticket in list(self._tickets):
            if ticket.decoding:
                decoding += 1
            elif now - ticket.opened_at > self._stale_after_s:
                ticket.close()  # never reached a first token: a lost placement
            else:
                prefilling += 1
                prefill_tokens += ticket.prefill_tokens
        return InflightView(prefilling, prefill_tokens, decoding, *self._others)
