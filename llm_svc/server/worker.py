"""The engine thread: owns the LLMEngine, steps it while there is work, and hands results
back through one thread-safe callback per step.

Nothing outside this thread touches the engine. Requests, aborts and calls arrive through a
queue that is drained between steps, so the gRPC side never waits on a step and a step
never waits on gRPC. A request is *admitted* when the scheduler first runs it (its
embeddings are present and prefill starts); that is when `Admitted` goes out.
"""

from __future__ import annotations

import concurrent.futures
import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from llm_svc.engine import EngineStats, LLMEngine, RequestOutput
from llm_svc.engine.sequence import Sequence, SequenceStatus
from llm_svc.server.errors import AbortedBeforeAcceptance, EngineFailure
from llm_svc.server.events import Admitted, Produced, Rejected, StreamEvent, Submission
from llm_svc.server.kv_events import KVEventLog
from llm_svc.server.metrics import LLMMetrics

log = logging.getLogger(__name__)

Deliver = Callable[[list[StreamEvent]], None]
_STOP = object()


@dataclass
class _Live:
    """A request the engine holds, with the clocks its TTFT / TPOT are measured on."""

    seq: Sequence
    submission: Submission
    admitted: bool = False
    first_token_at: float | None = None
    generated: int = 0


class EngineWorker:
    """`start()`, then `submit` / `abort` / `call` from any thread; `stop()` aborts what is
    left (those requests end with finish_reason "abort", or are rejected if not admitted).

    `deliver(events)` is called on this thread once per step with every event of the step;
    it must only hand them over (the server posts them to the event loop). It is the pod's
    work loop (iris/grpc_service.py) that liveness and readiness watch.
    """

    name = "the engine thread"

    def __init__(
        self,
        engine: LLMEngine,
        deliver: Deliver,
        kv_log: KVEventLog,
        metrics: LLMMetrics | None = None,
    ) -> None:
        self.engine = engine
        self._deliver = deliver
        self._kv_log = kv_log
        self._metrics = metrics
        self._inbox: queue.SimpleQueue = queue.SimpleQueue()
        self._live: dict[str, _Live] = {}
        self._events: list[StreamEvent] = []
        self._thread = threading.Thread(target=self._run, name="llm-engine", daemon=True)
        self.stats: EngineStats = engine.stats()
        # When the last step completed (or work arrived at an idle engine); None while no
        # work waits. Written by the engine thread only, read by the health check.
        self._progress_at: float | None = None

    # --- any thread --------------------------------------------------------------------
    def start(self) -> None:
        self._thread.start()

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def stalled_for(self) -> float:
        """Seconds without a completed step while work waits (0 while idle)."""
        since = self._progress_at
        return 0.0 if since is None else max(0.0, time.monotonic() - since)

    def submit(self, submission: Submission) -> None:
        self._inbox.put(("add", submission))

    def abort(self, request_id: str) -> None:
        self._inbox.put(("abort", request_id))

    def call(self, fn: Callable[[LLMEngine], Any]) -> concurrent.futures.Future:
        """Run `fn(engine)` on the engine thread between steps; its result as a future."""
        future: concurrent.futures.Future = concurrent.futures.Future()
        self._inbox.put(("call", fn, future))
        return future

    def stop(self, timeout_s: float = 10.0) -> None:
        """Abort every request, deliver their last events, end the thread."""
        if self._thread.is_alive():
            self._inbox.put((_STOP,))
            self._thread.join(timeout_s)
            if self._thread.is_alive():
                log.warning("engine thread still running %.1f s after stop", timeout_s)
        # Ends the embedding fetch threads and the cache channel (a waiting fetch stops).
        self.engine.close()

    # --- engine thread -----------------------------------------------------------------
    def _run(self) -> None:
        running = True
        while running:
            idle = not self.engine.has_unfinished()
            if idle:
                self._progress_at = None
            running = self._drain(block=idle)
            if self._progress_at is None:
                self._progress_at = time.monotonic()
            if not running:
                self._abort_all()
            if self.engine.has_unfinished():
                self._step()
                self._progress_at = time.monotonic()
            self._publish()
        self._progress_at = None

    def _drain(self, block: bool) -> bool:
        """Handle queued commands (waiting for one if `block`); False once told to stop."""
        try:
            command = self._inbox.get() if block else self._inbox.get_nowait()
            while True:
                if command[0] is _STOP:
                    return False
                self._handle(command)
                command = self._inbox.get_nowait()
        except queue.Empty:
            return True

    def _handle(self, command: tuple) -> None:
        kind = command[0]
        if kind == "add":
            self._add(command[1])
        elif kind == "abort":
            self.engine.abort(command[1])
        elif kind == "call":
            fn, future = command[1], command[2]
            if future.set_running_or_notify_cancel():
                try:
                    future.set_result(fn(self.engine))
                except Exception as err:  # the caller sees it; the loop goes on
                    future.set_exception(err)

    def _add(self, submission: Submission) -> None:
        try:
            seq = self.engine.add_request(
                submission.request_id,
                submission.prompt_token_ids,
                submission.params,
                items=submission.items or None,
                context=submission.context,
                cache_salt=submission.cache_salt,
            )
        except Exception as err:  # any refusal concerns this request only
            self._events.append(Rejected(submission.request_id, err))
            return
        self._live[submission.request_id] = _Live(seq, submission)

    def _step(self) -> None:
        try:
            outputs = self.engine.step()
        except Exception as err:
            log.exception("engine step failed; failing the %d requests it held", len(self._live))
            self._fail_all(err)
            return
        now = time.monotonic()
        for live in self._live.values():
            if not live.admitted and _started(live.seq):
                self._admit(live)
        for output in outputs:
            self._on_output(output, now)

    def _admit(self, live: _Live) -> None:
        live.admitted = True
        seq, submission = live.seq, live.submission
        event = Admitted(
            seq.request_id, seq.num_prompt_tokens, seq.num_cached_tokens, submission.image_tokens
        )
        self._events.append(event)
        if self._metrics is not None:
            self._metrics.observe_admitted(
                event.prompt_tokens, event.cached_tokens, event.image_tokens
            )

    def _on_output(self, output: RequestOutput, now: float) -> None:
        live = self._live.get(output.request_id)
        if live is None:
            return
        if not live.admitted:  # aborted while waiting for admission
            del self._live[output.request_id]
            error = output.error or AbortedBeforeAcceptance(
                f"request {output.request_id!r} aborted while waiting"
            )
            self._events.append(Rejected(output.request_id, error))
            return
        if output.error is not None:  # its own data failed mid-way: it alone ends
            del self._live[output.request_id]
            self._events.append(Rejected(output.request_id, output.error))
            if self._metrics is not None:
                self._metrics.observe_finished("error", None)
            return
        self._events.append(Produced(output.request_id, output))
        count = len(output.new_token_ids)
        if count and live.first_token_at is None:
            live.first_token_at = now
            if self._metrics is not None:
                self._metrics.observe_first_token(now - live.submission.arrival)
        live.generated += count
        if self._metrics is not None:
            self._metrics.observe_tokens(count)
        if output.finished:
            del self._live[output.request_id]
            if self._metrics is not None:
                per_token = None
                if live.first_token_at is not None and live.generated > 1:
                    per_token = (now - live.first_token_at) / (live.generated - 1)
                self._metrics.observe_finished(output.finish_reason or "abort", per_token)

    def _fail_all(self, error: Exception) -> None:
        failure = EngineFailure(f"engine step failed: {type(error).__name__}: {error}")
        for request_id in list(self._live):
            self._events.append(Rejected(request_id, failure))
            try:
                self.engine.abort(request_id)
            except Exception:
                log.exception("abort of %s after a failed step failed", request_id)
        self._live.clear()

    def _abort_all(self) -> None:
        for request_id in list(self._live):
            self.engine.abort(request_id)

    def _publish(self) -> None:
        """Publish KV events, refresh the load figures, hand the step's events over.

        KV events go first: a client that sees its request finish can count on the event
        log already holding what that step cached or evicted.
        """
        events, self._events = self._events, []
        try:
            self._kv_log.publish(self.engine.take_kv_events())
            self.stats = self.engine.stats()
            if self._metrics is not None:
                self._metrics.observe_stats(self.stats)
        except Exception:  # observability must never stop the engine
            log.exception("publishing KV events or load figures failed")
        if events:
            try:
                self._deliver(events)
            except Exception:  # e.g. the event loop closed at shutdown
                log.exception("handing %d events over failed", len(events))


def _started(seq: Sequence) -> bool:
    """The scheduler has run `seq` at least once (it may have finished in that step)."""
    return seq.status is SequenceStatus.RUNNING or seq.num_output_tokens > 0
