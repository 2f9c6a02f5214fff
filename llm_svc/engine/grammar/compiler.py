"""Checks constraints and compiles them in worker processes, once each.

Compilation never runs on the engine thread nor in the engine's process: `submit` returns a
future at once, shared by every request with the same constraint (bounded LRU keyed by
`Constraint.key`), and one of `threads` slots compiles it in its worker process
(workers.py). A compile that outlives `compile_timeout_s` (counted from when its worker
starts it) is ended by killing that worker; the slot starts a fresh one, so a slot is free
again within the timeout whatever the constraint.

A request waits for its grammar at most `queue_timeout_s`, in the queue and compiling
together. A job whose requests have all gone (aborted, or past that deadline) is dropped
before it takes a slot, and a running compile is killed at its last request's deadline: a
request that asks for a constraint already compiling joins that compile and moves its
deadline to its own, so each request waits its whole limit. A failed compile is remembered
for `failure_ttl_s` (failures.py): a plain error by its exact text, a compile that used up
`compile_timeout_s` also by its shape.
"""

from __future__ import annotations

import concurrent.futures as cf
import json
import logging
import queue
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from iris.json_depth import json_depth
from llm_svc.engine.errors import InvalidRequestError
from llm_svc.engine.grammar.failures import FailureCache
from llm_svc.engine.grammar.priority import idle_priority
from llm_svc.engine.grammar.spec import Constraint, ConstraintKind
from llm_svc.engine.grammar.workers import (
    WORKER_MODULE,
    CompileWorker,
    WorkerDied,
    WorkerTimeout,
    start_fork_server,
)

log = logging.getLogger(__name__)

FIELD = "constraint"  # the name the engine's errors give the field (the gateway maps it)
_MESSAGE_CHARS = 300  # of xgrammar's error message, in ours
_JSON_KINDS = (ConstraintKind.JSON_SCHEMA, ConstraintKind.STRUCTURAL_TAG)


@dataclass(frozen=True)
class GrammarLimits:
    """Bounds on one constraint: its text's size, its JSON nesting depth, its compile time
    (from when a worker starts it), how long a request waits for it (queue and compile
    together), and how long a failed compile is remembered."""

    max_bytes: int = 64 << 10
    max_depth: int = 32
    compile_timeout_s: float = 3.0
    queue_timeout_s: float = 7.0
    failure_ttl_s: float = 300.0

    def __post_init__(self) -> None:
        for name in ("max_bytes", "max_depth"):
            if getattr(self, name) < 1:
                raise ValueError(f"grammar {name} must be >= 1, got {getattr(self, name)}")
        for name in ("compile_timeout_s", "queue_timeout_s", "failure_ttl_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"grammar {name} must be > 0, got {getattr(self, name)}")


class _TimedOut(InvalidRequestError):
    """A compile that used up its whole time limit: remembered by shape too."""


class _CutShort(Exception):
    """A compile killed at its requests' deadline, before its own limit: `error` is theirs
    and says nothing of the constraint, so it is not remembered."""

    def __init__(self, error: InvalidRequestError) -> None:
        super().__init__(str(error))
        self.error = error


def check_constraint(constraint: Constraint, limits: GrammarLimits) -> None:
    """Raise InvalidRequestError if the constraint is too large, too deep or not JSON
    where JSON is due. (Whether xgrammar can compile it is known only once compiled.)"""
    name = constraint.describe()
    size = len(constraint.value.encode())
    if size > limits.max_bytes:
        raise InvalidRequestError(FIELD, name, f"must be at most {limits.max_bytes} bytes")
    if constraint.kind in _JSON_KINDS:
        try:
            document = json.loads(constraint.value)
        except RecursionError:
            raise InvalidRequestError(
                FIELD, name, f"nests deeper than the limit of {limits.max_depth} levels"
            ) from None
        except ValueError as err:
            raise InvalidRequestError(FIELD, name, f"is not valid JSON: {err}") from None
        if not isinstance(document, dict):
            raise InvalidRequestError(FIELD, name, "must be a JSON object")
        depth = json_depth(document)
        if depth > limits.max_depth:
            raise InvalidRequestError(
                FIELD, name, f"nests {depth} levels deep, over the limit of {limits.max_depth}"
            )
    elif constraint.kind is not ConstraintKind.JSON_OBJECT and not constraint.value:
        raise InvalidRequestError(FIELD, name, "must not be empty")


@dataclass(eq=False)
class _Job:
    """A compile and the requests waiting for it, the latest of which came at `submitted`
    and waits `wait_s` (None: no deadline): `waiters` of them while it is queued. `started`
    is when a worker began compiling it."""

    constraint: Constraint
    future: cf.Future
    submitted: float
    wait_s: float | None
    waiters: int = 1
    started: float | None = None

    def join(self, now: float, wait_s: float | None) -> None:
        """One more request waits from `now` for at most `wait_s`: the job's deadline
        moves to cover it (and every earlier one: the longest wait, from now)."""
        self.waiters += 1
        self.submitted = now
        self.wait_s = None if None in (self.wait_s, wait_s) else max(self.wait_s, wait_s)


class GrammarCompilerPool:
    """Compiles constraints for one tokenizer / vocabulary. xgrammar's tokenizer info is
    built once, on the first slot's thread (it reads the whole vocabulary), and handed to
    every worker serialised.

    `stop_token_ids` are the tokens that end a constrained request (the engine's EOS set):
    the grammar allows them once its text is complete. `worker_module` is the module a
    worker runs (tests substitute one that stalls on a test-only constraint)."""

    def __init__(
        self,
        tokenizer: Any,
        vocab_size: int,
        stop_token_ids: Iterable[int],
        limits: GrammarLimits,
        threads: int = 2,
        cache_entries: int = 256,
        worker_module: str = WORKER_MODULE,
    ) -> None:
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size
        self.stop_token_ids = sorted(set(stop_token_ids))
        self.limits = limits
        self.cache_entries = cache_entries
        self.worker_module = worker_module
        # Compiled grammars and compiles under way; failed ones leave it for `failures`.
        self._cache: OrderedDict[str, cf.Future] = OrderedDict()
        self._waiting: dict[str, _Job] = {}  # jobs no slot has taken yet, by key
        self._running: dict[str, _Job] = {}  # jobs a slot compiles, by key, until it ends
        self.failures = FailureCache(cache_entries, limits.failure_ttl_s)
        self._lock = threading.Lock()  # the caches (the engine thread takes it too)
        self._info_lock = threading.Lock()
        self._info = None
        self._info_json = ""
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._closed = False
        self.workers: list[CompileWorker | None] = [None] * max(1, threads)
        self.num_compiled = 0  # compiles started (cache misses), for tests and metrics
        self.ready_since: float | None = None  # when a worker first answered ready
        self._ready = threading.Event()  # set then
        self.num_timed_out = 0  # compiles killed with their worker (limit or deadline)
        self.num_dropped = 0  # jobs dropped unstarted: nobody waited for them any more
        self.killed_pids: deque[int] = deque(maxlen=64)  # the latest of those workers
        self._spare: queue.SimpleQueue = queue.SimpleQueue()  # a warm worker for a killed one
        self._threads: list[threading.Thread] = []

    def warm(self) -> None:
        """Start the slots, their workers and a spare worker (once; the pod calls it at
        start, a bare engine at its first constraint). Workers start on the slot threads."""
        with self._lock:
            if self._threads or self._closed:
                return
            start_fork_server()
            self._threads = [
                threading.Thread(
                    target=self._serve, args=(slot,), name=f"grammar-compile-{slot}", daemon=True
                )
                for slot in range(len(self.workers))
            ]
            for thread in self._threads:
                thread.start()
        threading.Thread(target=self._make_spare, name="grammar-spare", daemon=True).start()

    def wait_ready(self, timeout_s: float) -> bool:
        """Wait until a worker can take a compile (the fork server's first start imports
        torch and xgrammar); False if none could within `timeout_s`."""
        self.warm()
        return self._ready.wait(timeout_s)

    def check(self, constraint: Constraint) -> None:
        check_constraint(constraint, self.limits)

    def submit(self, constraint: Constraint, wait_s: float | None = None) -> cf.Future:
        """The compiled grammar's future (xgrammar.CompiledGrammar, or InvalidRequestError).
        It is `running()` once a worker has the job. The caller waits at most `wait_s`
        (counted from now, or from when the first worker was ready if later; None: no
        limit) and calls `release` if it stops waiting before the future is done."""
        key = constraint.key
        self.warm()
        now = time.monotonic()
        with self._lock:
            future = self._cache.get(key)
            if future is not None:
                self._cache.move_to_end(key)
                job = self._waiting.get(key) or self._running.get(key)
                if job is not None:
                    job.join(now, wait_s)
                return future
            future = cf.Future()
            failed = self.failures.lookup(constraint)
            if failed is not None:
                future.set_exception(failed)
                return future
            job = self._waiting[key] = _Job(constraint, future, now, wait_s)
            self._jobs.put(job)
            self.num_compiled += 1
            self._cache[key] = future
            while len(self._cache) > self.cache_entries:
                self._cache.popitem(last=False)
            return future

    def release(self, constraint: Constraint) -> None:
        """One request no longer waits for `constraint` (aborted, or past its deadline).
        A queued job nobody waits for is dropped before it takes a slot."""
        key = constraint.key
        with self._lock:
            job = self._waiting.get(key)
            if job is None:
                return
            job.waiters -= 1
            if job.waiters <= 0:
                self._drop(job)

    def _drop(self, job: _Job) -> None:
        """Under the lock: the job leaves the queue's bookkeeping and its future ends
        cancelled (the slot that takes it skips it)."""
        key = job.constraint.key
        del self._waiting[key]
        if self._cache.get(key) is job.future:
            del self._cache[key]
        job.future.cancel()
        self.num_dropped += 1

    def _deadline(self, job: _Job) -> float | None:
        if job.wait_s is None:
            return None
        return max(job.submitted, self.ready_since or job.submitted) + job.wait_s

    def _take(self, job: _Job) -> bool:
        """Start `job` on a slot; False if it was dropped (nobody waits for it any more)."""
        key = job.constraint.key
        with self._lock:
            if self._waiting.get(key) is job:
                deadline = self._deadline(job)
                if deadline is not None and deadline <= time.monotonic():
                    self._drop(job)  # its last request's deadline passed in the queue
                    return False
                del self._waiting[key]
            if not job.future.set_running_or_notify_cancel():
                return False
            self._running[key] = job
        return True

    def _cut_short(self, job: _Job) -> bool:
        """Whether the running `job`'s requests' deadline comes before its compile limit."""
        deadline = self._deadline(job)
        if deadline is None or job.started is None:
            return False
        return deadline < job.started + self.limits.compile_timeout_s

    def _compile_deadline(self, job: _Job) -> float:
        """When the running `job` must end: at its compile limit, or at its latest
        request's deadline if sooner (asked again when it comes: a request may have joined
        since). Once it has come, nobody joins the job any more; a compile cut short by its
        requests' deadline also leaves the cache, so a later request compiles anew."""
        with self._lock:
            key = job.constraint.key
            end = job.started + self.limits.compile_timeout_s
            if self._cut_short(job):
                end = self._deadline(job)
            if time.monotonic() >= end and self._running.get(key) is job:
                del self._running[key]
                if self._cut_short(job) and self._cache.get(key) is job.future:
                    del self._cache[key]
            return end

    def _finished(self, job: _Job) -> None:
        with self._lock:
            if self._running.get(job.constraint.key) is job:
                del self._running[job.constraint.key]

    def _failed(self, job: _Job, error: Exception, *, remember: bool, by_shape: bool) -> None:
        """A compile failed: its future ends with `error`, and it leaves the cache (a
        remembered failure lives in `failures`, for its time limit only)."""
        with self._lock:
            key = job.constraint.key
            if self._cache.get(key) is job.future:
                del self._cache[key]
            if remember:
                self.failures.record(job.constraint, error, by_shape=by_shape)
        job.future.set_exception(error)

    def close(self) -> None:
        self._closed = True
        for _ in self._threads:
            self._jobs.put(None)
        for worker in self.workers:
            if worker is not None:
                worker.kill()
        while not self._spare.empty():
            self._spare.get().kill()

    # --- slot threads ------------------------------------------------------------------
    def _serve(self, slot: int) -> None:
        """One compile slot: its worker (started now, so that the first job finds it warm)
        and the jobs it takes from the queue. The thread deserialises each compiled grammar,
        CPU the engine thread must not wait behind: it runs idle (priority.py)."""
        idle_priority(threading.get_native_id())
        try:
            worker = self.workers[slot] = self._new_worker()
            worker.wait_ready()
        except Exception:  # noqa: BLE001 - the slot starts one when a job comes
            if self.workers[slot] is not None:
                self.workers[slot].kill()
            self.workers[slot] = None
        else:
            self._worker_ready()
        while True:
            job = self._jobs.get()
            if job is None or self._closed:
                return
            if not self._take(job):
                continue
            try:
                job.future.set_result(self._compile(slot, job))
            except _CutShort as err:
                self._failed(job, err.error, remember=False, by_shape=False)
            except _TimedOut as err:
                self._failed(job, err, remember=True, by_shape=True)
            except InvalidRequestError as err:
                self._failed(job, err, remember=True, by_shape=False)
            except Exception as err:  # noqa: BLE001 - the request must end, not hang
                self._failed(job, err, remember=False, by_shape=False)
            finally:
                self._finished(job)

    def _compile(self, slot: int, job: _Job):
        import xgrammar

        worker = self.workers[slot]
        if worker is None:
            worker = self.workers[slot] = self._new_worker()
            if self._closed:
                worker.kill()
        constraint = job.constraint
        name = constraint.describe()
        try:
            if not worker.ready:
                worker.wait_ready()
                self._worker_ready()
            job.started = time.monotonic()  # its compile limit counts from here
            reply = worker.compile(
                constraint.kind.value, constraint.value, lambda: self._compile_deadline(job)
            )
        except WorkerTimeout:
            cut_short = self._cut_short(job)  # its requests' deadline came first
            self.num_timed_out += 1
            self.killed_pids.append(worker.pid)
            limit = self.limits.compile_timeout_s
            log.warning(
                "grammar compile worker %d killed: %s %s",
                worker.pid,
                name,
                "reached its requests' deadline" if cut_short else f"took over {limit:g} s",
            )
            self.workers[slot] = None if self._closed else self._replacement()
            if cut_short:
                raise _CutShort(
                    InvalidRequestError(
                        FIELD,
                        name,
                        f"was not compiled within the limit of {job.wait_s:g} s (waiting and "
                        "compiling; the pod's grammar compilers are busy)",
                    )
                ) from None
            raise _TimedOut(
                FIELD,
                name,
                f"did not compile within the limit of {self.limits.compile_timeout_s:g} s "
                "(too large or complex)",
            ) from None
        except WorkerDied as err:
            self.workers[slot] = None if self._closed else self._replacement()
            raise RuntimeError(f"grammar compile failed: {err}") from None
        if "error" in reply:
            message = reply["error"][:_MESSAGE_CHARS]
            raise InvalidRequestError(FIELD, name, f"cannot be compiled: {message}")
        return xgrammar.CompiledGrammar.deserialize_json(reply["compiled"], self._tokenizer_info())

    def _worker_ready(self) -> None:
        if self.ready_since is None:
            self.ready_since = time.monotonic()
        self._ready.set()

    def _replacement(self) -> CompileWorker:
        """A killed worker's successor: the spare, warm already (another spare starts)."""
        try:
            worker = self._spare.get_nowait()
        except queue.Empty:
            worker = None
        threading.Thread(target=self._make_spare, name="grammar-spare", daemon=True).start()
        return worker or self._new_worker()

    def _make_spare(self) -> None:
        try:
            worker = self._new_worker()
        except Exception:  # noqa: BLE001 - a slot then starts its own when it needs one
            return
        self._spare.put(worker)
        if self._closed:
            worker.kill()

    def _new_worker(self) -> CompileWorker:
        self._tokenizer_info()
        return CompileWorker(self._info_json, self.worker_module)

    def _tokenizer_info(self):
        """xgrammar's tokenizer info, built on first use (on a slot thread)."""
        with self._info_lock:
            if self._info is None:
                import xgrammar

                self._info = xgrammar.TokenizerInfo.from_huggingface(
                    self.tokenizer, vocab_size=self.vocab_size, stop_token_ids=self.stop_token_ids
                )
                self._info_json = self._info.serialize_json()
            return self._info
