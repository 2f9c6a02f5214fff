"""The dynamic batcher: one vision tower call for all distinct images of a window.

A job's life: `encode` admits it (or joins the identical job already in flight: dedup by
(key, token_count)), its cache lease is claimed, it is decoded and preprocessed in the
worker pool, waits in the ready queue, runs in one tower call with the rest of its batch,
and is stored in the cache as its own tensor — or as failed(reason), alone. Every caller
waiting on it gets the same `Outcome`. The work belongs to the batcher, not to a caller:
a caller that goes away stops waiting, nothing else. From its claim until it is stored the
job's cache lease is the batcher's: it takes it over from the gateway that leased it and
extends it every third of `lease_ms` (`_hold_leases`), so a slow encode never looks
abandoned to a pod waiting on it. A put the cache refuses abandons the lease (nothing is
stored) and the outcome is `retryable`: the next request may try again at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from opentelemetry import trace

from encoder_svc.jobs import (
    EncodeJob,
    ItemFailure,
    JobKey,
    Outcome,
    Prepared,
    QueueFull,
    ShuttingDown,
)
from encoder_svc.metrics import EncoderMetrics
from encoder_svc.preprocess import Preprocessor
from encoder_svc.sink import EmbeddingSink
from encoder_svc.tensors import owned_cpu

log = logging.getLogger(__name__)
SHUTDOWN_REASON = "encoder shut down before the image was encoded"
MIN_RETRY_MS, MAX_RETRY_MS, UNKNOWN_RATE_RETRY_MS = 50, 30_000, 1000
SHUTDOWN_FAIL_TIMEOUT_S = 5.0
MAX_REASON_CHARS = 1000  # the cache refuses reasons over 1024 characters


@dataclass(frozen=True)
class BatchLimits:
    """When a batch closes, and how much distinct work may be admitted at once."""

    max_images: int
    max_tokens: int
    max_wait_s: float
    max_queue_tokens: int
    lease_ms: int


@dataclass
class _Entry:
    job: EncodeJob
    future: asyncio.Future
    links: list[trace.Link] = field(default_factory=list)
    stage_began: float = field(default_factory=time.monotonic)  # when its current stage began


class Batcher:
    """Admits, deduplicates, batches and stores encode jobs. Call `start` inside the
    event loop, then `encode` from any number of callers; `stop` drains and fails the rest.
    It is the encoder's work loop (iris/grpc_service.py) that liveness and readiness watch."""

    name = "the batch loop"

    def __init__(
        self,
        runner,
        preprocessor: Preprocessor,
        sink: EmbeddingSink,
        limits: BatchLimits,
        metrics: EncoderMetrics,
        tracer: trace.Tracer,
    ) -> None:
        self._runner = runner
        self._preprocessor = preprocessor
        self._sink = sink
        self._limits = limits
        self.metrics = metrics
        self._tracer = tracer
        self.metrics.watch_queue(self.queued)
        self._entries: dict[JobKey, _Entry] = {}
        self._queued_tokens = 0
        self._ready: deque[tuple[float, Prepared]] = deque()
        # Admitted jobs still being claimed or prepared: what a batch may still wait for.
        self._preparing = 0
        self._wakeup = asyncio.Event()
        self._drained = asyncio.Event()
        self._drained.set()
        # One thread owns the tower: calls never overlap, and the event loop stays free.
        self._tower = ThreadPoolExecutor(max_workers=1, thread_name_prefix="vision-tower")
        self._tasks: set[asyncio.Task] = set()
        self._loop_task: asyncio.Task | None = None
        self._closing = False
        self._batch_started: float | None = None  # the batch running now began then
        # Jobs whose lease this encoder holds (claimed, not yet stored, failed or given up),
        # and a lock that keeps a renewal from re-taking a lease just abandoned.
        self._leased: dict[JobKey, EncodeJob] = {}
        self._lease_lock = asyncio.Lock()
        self.lease_renewals = 0  # renewal calls made (tests wait on it)

    # --- admission -----------------------------------------------------------------------

    @property
    def alive(self) -> bool:
        """The batch loop runs (started and not ended by an error)."""
        return self._loop_task is not None and not self._loop_task.done()

    def stalled_for(self) -> float:
        """Seconds the batch in progress has run (0 when none runs)."""
        started = self._batch_started
        return 0.0 if started is None else max(0.0, time.monotonic() - started)

    def queued(self) -> tuple[int, int]:
        """(images, vision tokens) admitted and not yet stored."""
        return len(self._entries), self._queued_tokens

    def start(self) -> None:
        self._loop_task = asyncio.get_running_loop().create_task(self._batch_loop())
        self._spawn(self._hold_leases())

    async def _hold_leases(self) -> None:
        """Extend the leases of the work in hand every third of the lease, so no lease
        runs out while its encode is still on the way."""
        interval_s = self._limits.lease_ms / 3000
        while True:
            await asyncio.sleep(interval_s)
            async with self._lease_lock:
                items = [(job.key, job.token_count) for job in self._leased.values()]
                if not items:
                    continue
                try:
                    await self._sink.claim(items, self._limits.lease_ms)
                    self.lease_renewals += 1
                except Exception as err:  # the next renewal tries again
                    log.warning("renewing %d lease(s) failed: %s", len(items), err)

    async def encode(self, jobs: Sequence[EncodeJob]) -> list[Outcome]:
        """Encode and store every job; return one outcome per job, in order.

        Raises QueueFull (nothing admitted) when the new distinct work does not fit the
        queue, ShuttingDown once `stop` began. Cancelling the caller leaves the work running.
        """
        futures = self._submit(jobs)
        # shield: a cancelled caller must not cancel futures that other callers share.
        return list(await asyncio.shield(asyncio.gather(*futures)))

    def _submit(self, jobs: Sequence[EncodeJob]) -> list[asyncio.Future]:
        if self._closing:
            raise ShuttingDown("encoder is shutting down")
        new: dict[JobKey, EncodeJob] = {}
        for job in jobs:
            if job.job_key not in self._entries:
                new.setdefault(job.job_key, job)
        needed = sum(job.token_count for job in new.values())
        limit = self._limits.max_queue_tokens
        if new and self._queued_tokens + needed > limit:
            self.metrics.rejected.inc()
            raise QueueFull(needed, self._queued_tokens, limit, self._retry_after_ms(needed))
        loop = asyncio.get_running_loop()
        links = _current_links()
        admitted = []
        for key, job in new.items():
            entry = _Entry(job, loop.create_future(), links)
            self._entries[key] = entry
            self._queued_tokens += job.token_count
            admitted.append(entry)
        self._preparing += len(admitted)
        if admitted:
            self._drained.clear()
            self._spawn(self._claim(admitted))
        self.metrics.submitted(len(jobs), len(jobs) - len(new))
        return [self._entries[job.job_key].future for job in jobs]

    def _retry_after_ms(self, needed: int) -> int:
        excess = self._queued_tokens + needed - self._limits.max_queue_tokens
        rate = self.metrics.tokens_window.rate()
        estimate = excess / rate * 1000 if rate > 0 else UNKNOWN_RATE_RETRY_MS
        floor = max(MIN_RETRY_MS, self._limits.max_wait_s * 1000)
        return int(min(MAX_RETRY_MS, max(floor, estimate)))

    # --- per job: claim, preprocess ------------------------------------------------------

    async def _claim(self, entries: list[_Entry]) -> None:
        items = [(entry.job.key, entry.job.token_count) for entry in entries]
        try:
            present = await self._sink.claim(items, self._limits.lease_ms)
        except Exception as err:  # the cache may come back before our put: encode anyway
            log.warning("cache claim of %d item(s) failed (%s); encoding anyway", len(items), err)
            present = [False] * len(items)
        cached = 0
        for entry, is_present in zip(entries, present, strict=True):
            if is_present:
                cached += 1
                self._preparing -= 1
                self._resolve(entry, Outcome(entry.job.key, True))
            else:
                if self._entries.get(entry.job.job_key) is entry:
                    self._leased[entry.job.job_key] = entry.job
                self._stage_done(entry, "claim")
                self._spawn(self._prepare(entry))
        if cached:
            self._wakeup.set()  # a batch waiting for these jobs stops waiting
        self.metrics.submitted(0, cached)

    async def _prepare(self, entry: _Entry) -> None:
        try:
            prepared = await self._preprocessor.prepare(entry.job)
        except ItemFailure as failure:
            prepared = failure
        finally:
            self._preparing -= 1  # ready, failed or cancelled: no batch need wait for it
        self._wakeup.set()
        if isinstance(prepared, ItemFailure):
            await self._fail(entry, prepared.kind, prepared.reason)
            return
        self._stage_done(entry, "prepare")
        self._ready.append((time.monotonic(), prepared))

    # --- batches -------------------------------------------------------------------------

    async def _batch_loop(self) -> None:
        while True:
            batch = await self._gather()
            self._batch_started = time.monotonic()
            try:
                await self._run(batch)
            except Exception:  # a bug here must not stop the loop; the items fail alone
                log.exception("batch of %d image(s) failed", len(batch))
                for prepared in batch:
                    entry = self._entries.get(prepared.job.job_key)
                    if entry is not None:
                        self._spawn(self._fail(entry, "internal", "internal encoder error"))
            finally:
                self._batch_started = None

    def _fitting(self) -> tuple[int, bool]:
        """How many ready items the next batch takes, and whether that batch is full."""
        count = tokens = 0
        for _, prepared in self._ready:
            cost = prepared.job.token_count
            if count == self._limits.max_images or (
                count and tokens + cost > self._limits.max_tokens
            ):
                return count, True
            count, tokens = count + 1, tokens + cost
        full = count >= self._limits.max_images or tokens >= self._limits.max_tokens
        return count, full

    async def _gather(self) -> list[Prepared]:
        """Wait for a first ready item, then for more until the batch is full, the first
        item has waited max_wait, or no admitted job is still being claimed or prepared
        (then nothing can join the batch soon, and waiting would only add latency)."""
        while not self._ready:
            self._wakeup.clear()
            await self._wakeup.wait()
        deadline = self._ready[0][0] + self._limits.max_wait_s
        while True:
            count, full = self._fitting()
            remaining = deadline - time.monotonic()
            if full or remaining <= 0 or not self._preparing:
                break
            self._wakeup.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wakeup.wait(), remaining)
        count, _ = self._fitting()
        return [self._ready.popleft()[1] for _ in range(count)]

    async def _run(self, batch: list[Prepared]) -> None:
        links = [link for prepared in batch for link in self._links_of(prepared)]
        tokens = sum(prepared.job.token_count for prepared in batch)
        attributes = {"encoder.images": len(batch), "encoder.vision_tokens": tokens}
        with self._tracer.start_as_current_span(
            "encoder.batch", links=links, attributes=attributes
        ):
            self.metrics.batch_size.observe(len(batch))
            self._stages_done(batch, "batch_wait")
            loop = asyncio.get_running_loop()
            try:
                outputs = await loop.run_in_executor(
                    self._tower, self._encode, [prepared.image for prepared in batch]
                )
            except Exception as err:
                log.warning("tower call on %d image(s) failed (%s)", len(batch), err)
                outputs = await self._encode_alone(batch)
        self._stages_done(batch, "tower")
        for prepared, output in zip(batch, outputs, strict=True):
            self._spawn(self._store(prepared, output))

    async def _encode_alone(self, batch: list[Prepared]) -> list:
        """After a failed batch call: one call per image, so a bad image fails alone."""
        if len(batch) == 1:
            return [ItemFailure("runner", "vision tower failed on this image")]
        loop = asyncio.get_running_loop()
        outputs = []
        for prepared in batch:
            try:
                result = await loop.run_in_executor(self._tower, self._encode, [prepared.image])
                outputs.append(result[0])
            except Exception as err:
                outputs.append(ItemFailure("runner", f"vision tower failed on this image: {err}"))
        return outputs

    def _encode(self, images: list) -> list:
        """Runs in the tower thread: one runner call, each output copied to its own storage."""
        window = self.metrics.tower_window
        window.busy_start()
        try:
            outputs = self._runner.encode(images)
        finally:
            window.busy_end()
        if len(outputs) != len(images):
            raise RuntimeError(f"runner returned {len(outputs)} outputs for {len(images)} images")
        return [owned_cpu(output) for output in outputs]

    # --- results -------------------------------------------------------------------------

    async def _store(self, prepared: Prepared, output) -> None:
        job = prepared.job
        entry = self._entries.get(job.job_key)
        if entry is None:  # already failed (shutdown sweep)
            return
        if isinstance(output, ItemFailure):
            await self._fail(entry, output.kind, output.reason)
            return
        problem = self._check_rows(job, output)
        if problem is not None:
            await self._fail(entry, "row_count", problem)
            return
        try:
            await self._sink.put(job.key, output, job.token_count)
        except Exception as err:
            # Nothing is stored: give the lease up, so the next request may try again at
            # once instead of waiting it out (a failed entry would refuse the image).
            log.warning("cache put of %s failed: %s", job.key.hex(), err)
            self._resolve(
                entry, Outcome(job.key, False, f"cache put failed: {err}", retryable=True)
            )
            async with self._lease_lock:
                try:
                    await self._sink.abandon([job.key])
                except Exception as abandon_err:
                    log.warning("abandoning %s failed: %s", job.key.hex(), abandon_err)
            return
        self.metrics.stored(job.token_count)
        self._stage_done(entry, "store")
        self._resolve(entry, Outcome(job.key, True))

    def _check_rows(self, job: EncodeJob, output) -> str | None:
        hidden = getattr(self._runner, "hidden_size", None)
        shape = tuple(output.shape)
        if len(shape) != 2 or shape[0] != job.token_count:
            return f"vision tower produced shape {list(shape)}, expected {job.token_count} rows"
        if hidden is not None and shape[1] != hidden:
            return f"vision tower produced {shape[1]} columns, expected hidden size {hidden}"
        return None

    async def _fail(self, entry: _Entry, kind: str, reason: str) -> None:
        reason = reason[:MAX_REASON_CHARS]
        try:
            await self._sink.fail(entry.job.key, reason, entry.job.token_count)
        except Exception as err:
            log.warning("cache fail of %s failed: %s", entry.job.key.hex(), err)
        self.metrics.failed.labels(kind).inc()
        self._resolve(entry, Outcome(entry.job.key, False, reason))

    def _resolve(self, entry: _Entry, outcome: Outcome) -> None:
        key = entry.job.job_key
        if self._entries.get(key) is entry:
            del self._entries[key]
            self._leased.pop(key, None)
            self._queued_tokens -= entry.job.token_count
            if not self._entries:
                self._drained.set()
        if not entry.future.done():
            entry.future.set_result(outcome)

    def _stage_done(self, entry: _Entry, stage: str) -> None:
        """Count the time `entry` spent in `stage`; its next stage begins now."""
        now = time.monotonic()
        self.metrics.stage_seconds.labels(stage).observe(now - entry.stage_began)
        entry.stage_began = now

    def _stages_done(self, batch: list[Prepared], stage: str) -> None:
        for prepared in batch:
            entry = self._entries.get(prepared.job.job_key)
            if entry is not None:
                self._stage_done(entry, stage)

    def _links_of(self, prepared: Prepared) -> list[trace.Link]:
        entry = self._entries.get(prepared.job.job_key)
        return entry.links if entry is not None else []

    def _spawn(self, coroutine) -> None:
        task = asyncio.get_running_loop().create_task(coroutine)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # --- shutdown ------------------------------------------------------------------------

    async def stop(self, grace_s: float) -> None:
        """Refuse new work, let admitted work finish for up to `grace_s`, then fail what is
        left in the cache (so no lease outlives this encoder) and release the threads."""
        self._closing = True
        if self._entries:
            try:
                await asyncio.wait_for(self._drained.wait(), grace_s)
            except TimeoutError:
                log.warning(
                    "%d item(s) in flight after %.1f s: failing them", len(self._entries), grace_s
                )
        tasks = [*self._tasks, *([self._loop_task] if self._loop_task else [])]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        leftover = list(self._entries.values())
        failing = asyncio.gather(
            *(self._fail(entry, "shutdown", SHUTDOWN_REASON) for entry in leftover)
        )
        try:
            # An unreachable cache must not hold the shutdown; the leases then just expire.
            await asyncio.wait_for(failing, SHUTDOWN_FAIL_TIMEOUT_S)
        except TimeoutError:
            log.warning("could not fail %d in-flight item(s) in the cache", len(leftover))
        for entry in leftover:
            self._resolve(entry, Outcome(entry.job.key, False, SHUTDOWN_REASON))
        self._tower.shutdown(wait=False, cancel_futures=True)
        self._preprocessor.close()


def _current_links() -> list[trace.Link]:
    context = trace.get_current_span().get_span_context()
    return [trace.Link(context)] if context.is_valid else []
