"""Requests whose grammar is still compiling: held out of the scheduler's queue (so they
neither block nor are blocked by anyone), released to it once compiled, or failed."""

from __future__ import annotations

import concurrent.futures as cf
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from llm_svc.engine.sequence import Sequence


class CompilingRequests:
    def __init__(self) -> None:
        self._seqs: list[Sequence] = []

    def __len__(self) -> int:
        return len(self._seqs)

    def add(self, seq: Sequence) -> None:
        self._seqs.append(seq)

    def discard(self, seq: Sequence) -> None:
        if seq in self._seqs:
            self._seqs.remove(seq)
            seq.grammar.release()

    def collect(self) -> tuple[list[Sequence], list[tuple[Sequence, Exception]]]:
        """(sequences now ready to schedule, in arrival order; (sequence, error) for those
        whose grammar failed to compile or missed its deadline). Both leave the holding."""
        ready, failed, left = [], [], []
        for seq in self._seqs:
            grammar = seq.grammar
            if grammar.ready():
                try:
                    grammar.start()
                except Exception as err:  # the compile's InvalidRequestError
                    failed.append((seq, err))
                else:
                    ready.append(seq)
            elif grammar.expired():
                failed.append((seq, grammar.timeout_error()))
                grammar.release()
            else:
                left.append(seq)
        self._seqs = left
        return ready, failed

    def wait(self, timeout_s: float) -> None:
        """Block until one compile finishes or `timeout_s` passes (when nothing can run)."""
        if self._seqs:
            futures = [seq.grammar.future for seq in self._seqs]
            cf.wait(futures, timeout_s, return_when=cf.FIRST_COMPLETED)
