"""A failed engine step, on the real engine thread and the tiny model: the step's requests
fail and no others; the pod turns unfit (`fault`), probes and serves again; failures in a
row, or one device error, end the thread for good (the server then exits non-zero, which
tests/e2e/test_broken_pod.py shows under `iris up`). The faults are injected through the
engine's test hook (`step_fault`), the one way to make a CPU forward fail on demand."""

from __future__ import annotations

import threading

import grpc
import pytest

from llm_svc.engine import SamplingParams
from llm_svc.server.builder import build_engine
from llm_svc.server.errors import EngineFailure, StoppedBeforeAcceptance, status_of
from llm_svc.server.events import Admitted, Produced, Rejected, Submission
from llm_svc.server.kv_events import KVEventLog
from llm_svc.server.step_failures import step_fault, step_fault_from_env
from llm_svc.server.worker import EngineWorker
from tests.llm_svc.server.pods import idle_engine_state, pod_settings

WAIT_S = 60.0  # a generous bound: each wait returns as soon as its event happens
PROMPT = [5, 6, 7, 8, 9]


@pytest.fixture(scope="module")
def engine(tiny_idefics3_dir):
    """One sequence at a time, so a second request waits outside the running step."""
    built = build_engine(pod_settings(tiny_idefics3_dir, max_num_seqs=1))
    yield built
    built.close()


class Run:
    """An EngineWorker on `engine` that records its events, faults and fatal reason."""

    def __init__(self, engine, max_failures: int = 3) -> None:
        self.events: list = []
        self.faults: list[str | None] = []
        self.fatal: list[str] = []
        self.changed = threading.Condition()
        self.worker = EngineWorker(
            engine,
            self._deliver,
            KVEventLog(1024),
            max_failures=max_failures,
            on_fault=self.faults.append,
            on_fatal=self.fatal.append,
        )
        self.worker.start()

    def _deliver(self, events) -> None:
        with self.changed:
            self.events.extend(events)
            self.changed.notify_all()

    def submit(self, request_id: str, max_tokens: int) -> None:
        params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
        self.worker.submit(Submission(request_id, PROMPT, params))

    def ended(self, request_id: str) -> object:
        """Wait for the request's last event: its finished output, or its rejection."""

        def last():
            for event in self.events:
                if event.request_id != request_id:
                    continue
                if isinstance(event, Rejected):
                    return event
                if isinstance(event, Produced) and event.output.finished:
                    return event
            return None

        with self.changed:
            assert self.changed.wait_for(lambda: last() is not None, WAIT_S), self.events
            return last()


def _fail_once_when(condition):
    fired = []

    def fault() -> None:
        if not fired and condition():
            fired.append(True)
            raise RuntimeError("injected step fault")

    return fault


def test_a_failed_step_fails_its_requests_only_then_a_probe_serves_again(engine):
    run = Run(engine)
    # The step that fails is one of A's decode steps; B waits outside it (one sequence at
    # a time) and must come through untouched.
    engine_requests = engine.requests
    engine.step_fault = _fail_once_when(
        lambda: "a" in engine_requests and engine_requests["a"].num_output_tokens >= 1
    )
    try:
        run.submit("a", 50)
        run.submit("b", 4)
        failed, finished = run.ended("a"), run.ended("b")
    finally:
        engine.step_fault = None
    assert isinstance(failed, Rejected) and isinstance(failed.error, EngineFailure)
    assert status_of(failed.error)[0] is grpc.StatusCode.UNAVAILABLE  # another pod may serve
    assert isinstance(finished, Produced) and finished.output.finish_reason == "length"
    # Unfit while probing, then fit again; the thread goes on.
    assert len(run.faults) == 2 and "engine step failed (1 in a row" in run.faults[0]
    assert run.faults[1] is None and run.worker.fault is None and run.worker.alive
    assert run.fatal == []
    assert run.worker.call(idle_engine_state).result(WAIT_S)["pages_in_use"] == 0
    run.worker.stop()


def test_a_request_waiting_when_the_pod_stops_is_unavailable_not_cancelled(engine):
    """The pod, not the request, is why it ends: UNAVAILABLE, so the gateway tries another
    pod (CANCELLED is for an Abort, whose caller no longer waits). The step hook holds the
    engine thread in a step of "seated" while the stop is queued, so "waiting" is still
    waiting when the stop is handled, however fast the machine."""
    entered, release = threading.Event(), threading.Event()
    engine_requests = engine.requests

    def gate() -> None:
        seated = engine_requests.get("seated")
        if seated is not None and seated.num_output_tokens >= 1 and not entered.is_set():
            entered.set()
            assert release.wait(WAIT_S)

    run = Run(engine)
    engine.step_fault = gate
    try:
        run.submit("seated", 50)
        run.submit("waiting", 4)  # one sequence at a time: it waits for admission
        assert entered.wait(WAIT_S)
        stopper = threading.Thread(target=run.worker.stop)
        stopper.start()
        while run.worker._inbox.empty():  # the stop is queued behind the held step
            stopper.join(0.001)
        release.set()
        stopper.join(WAIT_S)
    finally:
        release.set()
        engine.step_fault = None
    waiting = run.ended("waiting")
    assert isinstance(waiting, Rejected) and isinstance(waiting.error, StoppedBeforeAcceptance)
    assert status_of(waiting.error)[0] is grpc.StatusCode.UNAVAILABLE


def test_failures_in_a_row_counting_probes_end_the_thread(engine):
    run = Run(engine, max_failures=3)
    engine.step_fault = step_fault("step")
    try:
        run.submit("c", 4)
        rejected = run.ended("c")
        run.worker._thread.join(WAIT_S)
    finally:
        engine.step_fault = None
    assert isinstance(rejected, Rejected) and isinstance(rejected.error, EngineFailure)
    assert not run.worker.alive
    # The failed step, then two failed probes: the third failure in a row ends it.
    assert [("in a row" in f) for f in run.faults] == [True, True]
    assert len(run.fatal) == 1 and "3 engine steps and probes failed in a row" in run.fatal[0]
    # A request sent now is refused at once, never left waiting.
    run.submit("late", 4)
    assert isinstance(run.ended("late"), Rejected)
    assert idle_engine_state(engine) == {
        "requests": 0,
        "running": 0,
        "waiting": 0,
        "pages_in_use": 0,
    }


def test_a_device_error_ends_the_thread_at_once(engine):
    run = Run(engine, max_failures=3)
    engine.step_fault = step_fault("device")
    try:
        run.submit("d", 4)
        rejected = run.ended("d")
        run.worker._thread.join(WAIT_S)
    finally:
        engine.step_fault = None
    assert isinstance(rejected, Rejected)
    assert not run.worker.alive and run.faults == []  # no probe on a poisoned device
    assert len(run.fatal) == 1 and "illegal memory access" in run.fatal[0]


def test_out_of_memory_shrinks_the_step_and_prefills_again(engine):
    budget = engine.scheduler.token_budget
    run = Run(engine)
    engine.step_fault = step_fault("oom:1")
    try:
        run.submit("e", 4)
        finished = run.ended("e")
    finally:
        engine.step_fault = None
        shrunk = engine.scheduler.token_budget
        engine.scheduler.token_budget = budget
    assert isinstance(finished, Produced) and finished.output.finish_reason == "length"
    assert shrunk == budget // 2
    assert run.faults == [] and run.fatal == []  # it did not count as a failure
    run.worker.stop()


def test_the_fault_hook_is_off_without_the_test_flag():
    assert step_fault_from_env({"IRIS_TEST_STEP_FAULT": "step"}) is None
    hook = step_fault_from_env({"IRIS_TEST_HOOKS": "1", "IRIS_TEST_STEP_FAULT": "step:1"})
    with pytest.raises(RuntimeError, match="injected"):
        hook()
    hook()  # only the first step failed
    with pytest.raises(ValueError, match="IRIS_TEST_STEP_FAULT kind 'melt'"):
        step_fault("melt")


def test_an_add_never_takes_over_an_id_whose_abort_is_pending(engine):
    """The abort of "x" and a new "x" reach the engine thread in one drain (the step hook
    holds the thread while both are queued): the new one is refused by name, and the old
    one's abort is not delivered as the new one's answer, nor does the new one run on with
    no reader. (The gateway sends every attempt under an id of its own, so this is a
    client's reuse of an id, not a retry.)"""
    entered, release = threading.Event(), threading.Event()
    engine_requests = engine.requests

    def gate() -> None:
        held = engine_requests.get("x")
        if held is not None and held.num_output_tokens >= 1 and not entered.is_set():
            entered.set()
            assert release.wait(WAIT_S)

    run = Run(engine)
    engine.step_fault = gate
    try:
        run.submit("x", 50)
        assert entered.wait(WAIT_S)
        seen = len(run.events)
        run.worker.abort("x")
        run.submit("x", 4)
        release.set()
        with run.changed:
            assert run.changed.wait_for(
                lambda: any(isinstance(e, Rejected) for e in run.events[seen:]), WAIT_S
            ), run.events
        state = run.worker.call(idle_engine_state).result(WAIT_S)
    finally:
        release.set()
        engine.step_fault = None
        run.worker.stop()
    later = [e for e in run.events[seen:] if e.request_id == "x"]
    refused = [e for e in later if isinstance(e, Rejected)]
    assert len(refused) == 1 and not any(isinstance(e, Admitted) for e in later), later
    assert status_of(refused[0].error) == (
        grpc.StatusCode.INVALID_ARGUMENT,
        "request_id='x' is invalid: still in use on this pod (its last request is ending)",
    )
    assert state == {"requests": 0, "running": 0, "waiting": 0, "pages_in_use": 0}
