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
from llm_svc.server.errors import (
    AbortedBeforeAcceptance,
    EngineFailure,
    RequestError,
    StoppedBeforeAcceptance,
)
from llm_svc.server.events import Admitted, Produced, Rejected, StreamEvent, Submission
from llm_svc.server.kv_events import KVEventLog
from llm_svc.server.metrics import LLMMetrics
from llm_svc.server.step_failures import StepFailure, classify

log = logging.getLogger(__name__)

Deliver = Callable[[list[StreamEvent]], None]
_STOP = object()
_PUBLISH = "publish"  # a command that only wakes the loop: it publishes after it
# How long the engine thread waits for the pod to publish NOT_SERVING before it probes.
FAULT_PUBLISH_WAIT_S = 10.0


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

    A failed step fails that step's requests only (the rest stay queued, their KV
    untouched). An out-of-memory step first shrinks the step and puts its requests back to
    be prefilled again. Otherwise `fault` says why the pod is not ready, `on_fault(fault)`
    is called (the server publishes NOT_SERVING; it returns once that is done) and a probe
    (a tiny forward, alone) runs: if it passes, `fault` clears, `on_fault(None)`, and the
    pod serves again. `max_failures` failed steps and probes with no successful step
    between them, or one device error (a CUDA error other than out-of-memory), end the
    thread: every request left fails, `fatal` says why and `on_fatal(fatal)` is called (the
    server then exits non-zero, to be restarted).
    """

    name = "the engine thread"

    def __init__(
        self,
        engine: LLMEngine,
        deliver: Deliver,
        kv_log: KVEventLog,
        metrics: LLMMetrics | None = None,
        max_failures: int = 3,
        on_fault: Callable[[str | None], None] | None = None,
        on_fatal: Callable[[str], None] | None = None,
    ) -> None:
        self.engine = engine
        self.max_failures = max_failures
        self._on_fault = on_fault
        self._on_fatal = on_fatal
        self._failures = 0  # failed steps and probes since the last successful step
        self._stopping = False  # told to stop: what still waits is dropped as UNAVAILABLE
        # Why the pod must not take work while it probes (None: healthy), and why the
        # thread ended for good; written by the engine thread, read by readiness.
        self.fault: str | None = None
        self.fatal: str | None = None
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
        store = getattr(engine, "kv_store", None)
        if store is not None:
            # Pages the store's writer finishes after the last step are announced at once,
            # not at the next step: an idle pod's last turn is in the gateway's index too.
            store.on_written = self.publish_soon

    # --- any thread --------------------------------------------------------------------
    def start(self) -> None:
        self._thread.start()

    def publish_soon(self) -> None:
        """Wake the engine thread to publish its KV events (it does after every command)."""
        self._inbox.put((_PUBLISH,))

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def stalled_for(self) -> float:
        """Seconds without a completed step while work waits (0 while idle)."""
        since = self._progress_at
        return 0.0 if since is None else max(0.0, time.monotonic() - since)

    def submit(self, submission: Submission) -> None:
        if self.fatal is not None:  # the thread has ended or is ending: refuse at once
            self._deliver([Rejected(submission.request_id, EngineFailure(self.fatal))])
            return
        self._inbox.put(("add", submission))

    def abort(self, request_id: str) -> None:
        self._inbox.put(("abort", request_id))

    def call(
        self, fn: Callable[[LLMEngine], Any], publish_kv: bool = False
    ) -> concurrent.futures.Future:
        """Run `fn(engine)` on the engine thread between steps; its result as a future.
        With `publish_kv`, the KV events `fn` caused are published before the result is
        set, so a caller that has the result finds them in the event log."""
        future: concurrent.futures.Future = concurrent.futures.Future()
        self._inbox.put(("call", fn, future, publish_kv))
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
                self._stopping = True
                self._abort_all()
            if self.engine.has_unfinished():
                self._step()
                self._progress_at = time.monotonic()
            self._publish()
            if self.fatal is not None:
                running = False
        self._progress_at = None
        if self.fatal is not None:
            self._refuse_queued(EngineFailure(self.fatal))

    def _refuse_queued(self, failure: EngineFailure) -> None:
        """After the thread's end: what is still queued is refused, not left waiting."""
        while True:
            try:
                command = self._inbox.get_nowait()
            except queue.Empty:
                break
            if command[0] == "add":
                self._events.append(Rejected(command[1].request_id, failure))
            elif command[0] == "call" and command[2].set_running_or_notify_cancel():
                command[2].set_exception(failure)
        self._publish()

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
        if kind == _PUBLISH:
            return
        if kind == "add":
            self._add(command[1])
        elif kind == "abort":
            self.engine.abort(command[1])
        elif kind == "call":
            fn, future, publish_kv = command[1], command[2], command[3]
            if future.set_running_or_notify_cancel():
                try:
                    result = fn(self.engine)
                    if publish_kv:
                        self._kv_log.publish(self.engine.take_kv_events())
                    future.set_result(result)
                except Exception as err:  # the caller sees it; the loop goes on
                    future.set_exception(err)

    def _add(self, submission: Submission) -> None:
        if submission.request_id in self._live:
            # Its last request is ending (an abort's output still to come): taking the id
            # over would hand that abort to this request and leave this one unread.
            self._events.append(
                Rejected(
                    submission.request_id,
                    RequestError(
                        f"request_id={submission.request_id!r} is invalid: still in use on "
                        "this pod (its last request is ending)"
                    ),
                )
            )
            return
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
        started_ns = time.time_ns()
        try:
            outputs = self.engine.step()
        except Exception as err:
            self._step_failed(err)
            return
        self._failures = 0
        now = time.monotonic()
        for live in self._live.values():
            if not live.admitted and _started(live.seq):
                self._admit(live, started_ns)
        self._handle_outputs(outputs, now)

    def _handle_outputs(self, outputs: list[RequestOutput], now: float | None = None) -> None:
        now = time.monotonic() if now is None else now
        for output in outputs:
            self._on_output(output, now)

    # --- after a failed step -------------------------------------------------------------
    def _step_failed(self, error: Exception) -> None:
        kind = classify(error)
        failure = EngineFailure(f"engine step failed: {type(error).__name__}: {error}")
        if kind is StepFailure.OUT_OF_MEMORY and self.engine.shrink_step():
            log.warning("engine step ran out of memory; its requests are prefilled again")
            self._handle_outputs(self.engine.recover(failure, recompute=True))
            return
        log.error("engine step failed (%s): %s", kind.value, error, exc_info=error)
        self._handle_outputs(self.engine.recover(failure, recompute=False))
        if kind is StepFailure.DEVICE:
            self._die(f"device error in an engine step: {type(error).__name__}: {error}")
            return
        self._failures += 1
        while self._failures < self.max_failures:
            self.fault = (
                f"engine step failed ({self._failures} in a row, limit {self.max_failures}): "
                f"{type(error).__name__}: {error}; probing"
            )
            self._publish()  # the failed requests learn it before the probe runs
            self._tell(self.fault)
            try:
                self.engine.probe()
            except Exception as probe_error:
                log.error("probe step failed: %s", probe_error)
                if classify(probe_error) is StepFailure.DEVICE:
                    self._die(f"device error in a probe step: {probe_error}")
                    return
                self._failures += 1
                error = probe_error
                continue
            log.info("probe step passed: serving again")
            self.fault = None
            self._tell(None)
            return
        self._die(
            f"{self._failures} engine steps and probes failed in a row (limit "
            f"{self.max_failures}); last: {type(error).__name__}: {error}"
        )

    def _tell(self, fault: str | None) -> None:
        if self._on_fault is None:
            return
        try:
            self._on_fault(fault)
        except Exception:  # e.g. the event loop is closing: readiness follows `fault` anyway
            log.exception("publishing the pod's fault failed")

    def _die(self, reason: str) -> None:
        """End for good: fail every request left, say why (the thread ends after this)."""
        log.critical("the engine cannot go on: %s", reason)
        self.fault = self.fatal = reason
        self._fail_all(EngineFailure(reason))
        self._publish()
        if self._on_fatal is not None:
            self._on_fatal(reason)

    def _admit(self, live: _Live, step_started_ns: int = 0) -> None:
        live.admitted = True
        seq, submission = live.seq, live.submission
        event = Admitted(
            seq.request_id,
            seq.num_prompt_tokens,
            seq.num_cached_tokens,
            submission.image_tokens,
            step_started_ns,
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
            error = output.error
            if error is None and self._stopping:
                error = StoppedBeforeAcceptance(
                    f"the pod stopped while request {output.request_id!r} waited"
                )
            elif error is None:
                error = AbortedBeforeAcceptance(
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

    def _fail_all(self, failure: EngineFailure) -> None:
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
