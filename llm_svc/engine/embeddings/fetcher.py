"""Fetching a sequence's embeddings on a small thread pool, so the engine loop never waits
on the cache or the vision tower."""

from __future__ import annotations

import concurrent.futures as cf
import logging
from dataclasses import dataclass

import torch
from opentelemetry import trace

from llm_svc.engine.embeddings.base import EmbeddingSource
from llm_svc.engine.errors import EmbeddingMissingError, RequestDataError
from llm_svc.engine.sequence import Sequence

log = logging.getLogger(__name__)
_tracer = trace.get_tracer(__name__)


@dataclass
class FetchResult:
    """A finished fetch: the embeddings by item index, or the error that ends the request."""

    seq: Sequence
    embeddings: dict[int, torch.Tensor]
    error: BaseException | None = None


class EmbeddingFetcher:
    """`start(seq, indices)` → later `collect()` the finished ones; `cancel(seq)` for a
    sequence that ended meanwhile (what arrives for it is released). `num_fetched` counts
    the items fetched (each one once per fetch).

    `held_bytes` counts the embeddings running sequences hold or are fetching, from the
    start of a fetch until `release` / `cancel`; `can_hold` says whether another fetch
    stays within `max_held_bytes` (IRIS_LLM_MAX_HELD_EMBEDDING_BYTES, a term of the memory
    budget), and the scheduler waits when it does not."""

    def __init__(
        self,
        source: EmbeddingSource,
        hidden: int,
        dtype: torch.dtype,
        device: torch.device,
        workers: int = 4,
        max_held_bytes: int = 1 << 62,
    ) -> None:
        self.source = source
        self.hidden, self.dtype, self.device = hidden, dtype, device
        self.max_held_bytes = max_held_bytes
        self.held_bytes = 0
        self._held: dict[Sequence, int] = {}
        self._row_bytes = hidden * torch.empty((), dtype=dtype).element_size()
        self.pool = cf.ThreadPoolExecutor(workers, thread_name_prefix="llm-embeddings")
        self.inflight: dict[Sequence, cf.Future] = {}
        self.num_fetched = 0

    def __len__(self) -> int:
        return len(self.inflight)

    def bytes_for(self, items) -> int:
        """Bytes the embeddings of `items` take once held."""
        return sum(item.token_count for item in items) * self._row_bytes

    def can_hold(self, seq: Sequence, indices: list[int]) -> bool:
        """Whether fetching `seq`'s items `indices` keeps the held embeddings within
        `max_held_bytes`."""
        needed = self.bytes_for(seq.items[index] for index in indices)
        return self.held_bytes + needed <= self.max_held_bytes

    def start(self, seq: Sequence, indices: list[int]) -> None:
        assert seq not in self.inflight, "one fetch per sequence at a time"
        items = {index: seq.items[index] for index in indices}
        self.num_fetched += len(items)
        size = self.bytes_for(items.values())
        self._held[seq] = self._held.get(seq, 0) + size
        self.held_bytes += size
        if seq.context is None:
            self.inflight[seq] = self.pool.submit(self._fetch, items)
        else:  # in the request's context (a copy: a context runs in one thread at a time)
            self.inflight[seq] = self.pool.submit(seq.context.copy().run, self._fetch, items)

    def _fetch(self, items) -> dict[int, torch.Tensor]:
        # A child of the request's llm.Generate span (the fetch runs in its context): the
        # pod's wait for its embeddings, encoder and cache reads included.
        with _tracer.start_as_current_span("llm.embeddings.fetch") as span:
            span.set_attribute("iris.images", len(items))
            out = self.source.fetch(items, self.hidden, self.dtype)
        try:
            for index, item in items.items():
                embedding = self._checked(index, item, out.get(index))
                out[index] = embedding.to(self.device, self.dtype, non_blocking=True)
        except BaseException as err:
            self.source.release(list(items.values()))
            if isinstance(err, RequestDataError) and err.item_index in items:
                # Released first, so the source may forget its copy; the cache checks the
                # entry itself and drops it, and the next request re-encodes.
                self.source.report_corrupt(items[err.item_index], str(err))
            raise
        return out

    def _checked(self, index: int, item, embedding: torch.Tensor | None) -> torch.Tensor:
        """`embedding` if it can be used for item `index`: the wrong shape is a miss
        (EmbeddingMissingError, the gateway re-encodes); NaN or inf values are a
        RequestDataError, caught here on the fetch thread (on the source's device, before
        the copy) so they never reach the batch: NaN in one request's KV would spread to
        every decode batch that reads its page."""
        expected = (item.token_count, self.hidden)
        if embedding is None or tuple(embedding.shape) != expected:
            shape = None if embedding is None else tuple(embedding.shape)
            raise EmbeddingMissingError(
                f"items[{index}] came back with shape {shape}, expected {expected}", index
            )
        if embedding.is_floating_point() and not bool(torch.isfinite(embedding).all()):
            bad = int((~torch.isfinite(embedding)).sum())
            raise RequestDataError(
                f"items[{index}] (key {item.key.hex()}) embedding has {bad} NaN or infinite values",
                index,
            )
        return embedding

    def collect(self) -> list[FetchResult]:
        """The fetches that have finished since the last call."""
        done = [seq for seq, future in self.inflight.items() if future.done()]
        results = []
        for seq in done:
            future = self.inflight.pop(seq)
            error = future.exception()
            results.append(FetchResult(seq, {} if error else future.result(), error))
        return results

    def wait(self, timeout_s: float) -> None:
        """Block until a fetch finishes or `timeout_s` passes (when nothing else can run)."""
        if self.inflight:
            cf.wait(list(self.inflight.values()), timeout_s, return_when=cf.FIRST_COMPLETED)

    def cancel(self, seq: Sequence) -> None:
        """`seq` ended while fetching: drop its fetch and release what it brings."""
        self.held_bytes -= self._held.pop(seq, 0)
        future = self.inflight.pop(seq, None)
        if future is None:
            return
        items = seq.items

        def release(done: cf.Future) -> None:
            if not done.cancelled() and done.exception() is None:
                self.source.release([items[index] for index in done.result()])

        future.cancel() or future.add_done_callback(release)

    def release(self, seq: Sequence) -> None:
        """`seq` has ended: give back the embeddings it held."""
        self.held_bytes -= self._held.pop(seq, 0)
        if seq.embeddings:
            self.source.release([seq.items[index] for index in seq.embeddings])
            seq.embeddings = {}

    def close(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)
        self.source.close()
