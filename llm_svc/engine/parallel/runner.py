"""The model runner of a tensor-parallel rank (every rank), and rank 0's driver of a step.

Every rank holds a ShardRunner: its shard of the weights, its heads' share of the same KV
pages (the page count is agreed as the minimum over ranks, so the pod has one set of
pages), and a forward that ends in the gathered logits. Rank 0's DriverRunner is the
engine's runner: for each step it sends the packed inputs (channel.py) and then runs the
same forward as the others.
"""

from __future__ import annotations

import atexit
import bisect
import logging
import threading
import time
from contextlib import contextmanager, suppress

import torch

from llm_svc.engine.config import EngineConfig
from llm_svc.engine.embeddings.assembly import ChunkImageRows
from llm_svc.engine.model_runner import ModelRunner, StepInputs
from llm_svc.engine.parallel.channel import PING, STOP, StepChannel, StepMessage
from llm_svc.engine.parallel.group import CollectiveError, RankFailedError, RankGroup
from llm_svc.engine.parallel.ranks import RankProcesses, join_group
from llm_svc.engine.state_pool import HybridSizing

log = logging.getLogger(__name__)


class ShardRunner(ModelRunner):
    """One rank's runner; `forward(message)` is a step as every rank runs it. A model with
    sliding layers has its window pool here too, each rank its heads' share of the same
    pages: the step channel carries both pools' slots and tables."""

    def __init__(self, config: EngineConfig, group: RankGroup) -> None:
        self.group = group
        super().__init__(config, group)
        mc = self.model_config
        # Image rows cross whole: the main row and every deepstack level (each rank adds them).
        self.channel = StepChannel(
            group, config.max_num_seqs, mc.embedding_width, config.torch_dtype
        )

    def _num_pages(self, config: EngineConfig) -> int:
        return self.group.min_host(super()._num_pages(config))

    def _kind_sizing(self, config: EngineConfig) -> tuple[int, int]:
        # One set of pages per pool: each the least any rank can hold (every rank's own
        # split already fits it, so the pairwise minimum does too).
        full, window = super()._kind_sizing(config)
        return self.group.min_host(full), self.group.min_host(window)

    def _least_over_ranks(self, value: int) -> int:
        return self.group.min_host(value)

    def _hybrid_sizing(self, config: EngineConfig) -> HybridSizing:
        # One set of slots: the pages and snapshot slots every rank can hold.
        sizing = super()._hybrid_sizing(config)
        pages = self.group.min_host(sizing.num_pages)
        snapshots = self.group.min_host(sizing.snapshot_slots)
        return HybridSizing(pages, sizing.running_slots, snapshots)

    def profiling_collectives(self):
        # Another rank may still be loading: the start group's timeout, not a step's.
        return self.group.collectives_on_start_group()

    @torch.inference_mode()
    def execute(self, inputs: StepInputs, input_embeds: torch.Tensor | None = None,
                deepstack=None):  # fmt: skip
        hidden = self.forward_hidden(inputs, input_embeds, deepstack)
        local = self.model.compute_logits(self.sampled_hidden(inputs, hidden))
        vocab = self.model_config.vocab_size
        if local.shape[0] == 0:  # no row samples this step: nothing to gather
            return local.new_empty(0, vocab)
        return self.group.gather_columns(local, vocab)

    def forward(self, message: StepMessage) -> torch.Tensor:
        if message.journal and self.rank != 0:  # rank 0 did them as it journaled
            self.replay(message.journal)
            if self.host_tier is not None:
                self.host_tier.before_step()
        inputs = StepInputs(
            message.input_ids, message.positions, message.meta, message.sample_rows, [],
            message.state_slots,
        )  # fmt: skip
        if self.keeps_sampled_rows:  # Gemma 4: each sample row's chunk, as rank 0 had it
            starts = message.meta.query_starts
            rows = message.sample_rows.tolist()
            inputs.sample_entries = [bisect.bisect_right(starts, row) - 1 for row in rows]
            # Draft rows share their chunk's entry (speculative decoding).
            inputs.num_drafts = len(rows) - len(set(inputs.sample_entries))
        rows = [None]
        if message.image_dest is not None:
            rows = [ChunkImageRows(message.image_dest, message.image_source)]
        embeds, deepstack = self.assemble(inputs, rows, starts=[0])
        return self.execute(inputs, embeds, deepstack)

    def replay(self, journal: list[tuple[int, int, int]]) -> None:
        """Rank 0's state-pool and host-tier operations, in its order (runs of one kind
        at a time)."""
        start = 0
        for end in range(1, len(journal) + 1):
            if end < len(journal) and (journal[end][0] < 10) == (journal[start][0] < 10):
                continue
            run = journal[start:end]
            if run[0][0] < 10:
                self.state_pool.replay(run)
            else:
                self.host_tier.replay(run)
            start = end

    def serve(self) -> None:
        """A rank other than 0: run each step rank 0 sends, until STOP. A step rank 0
        dropped (its own error mid-step) is dropped here too; any other failed collective
        ends the rank (CollectiveError)."""
        while True:
            try:
                kind, message = self.channel.recv()
                if kind == STOP:
                    return
                if kind == PING:
                    self.group.ping()
                else:
                    self.forward(message)
            except CollectiveError:
                if not self.group.step_dropped():
                    raise
                log.warning("rank 0 dropped step generation %d", self.group.generation)
                self.group.reset()


def flatten_images(image_rows: list, starts: list[int]):
    """(packed destination rows, source rows) of a step's chunks, or (None, None)."""
    chunks = zip(image_rows, starts, strict=True)
    pairs = [(rows.dest_rows + start, rows.source) for rows, start in chunks if rows]
    if not pairs:
        return None, None
    return torch.cat([dest for dest, _ in pairs]), torch.cat([src for _, src in pairs])


class DriverRunner(ShardRunner):
    """Rank 0: starts the other ranks, hands them each step, pings them when idle (a hung
    rank is found within the timeout even then), and stops them on `close`.

    A rank that dies or stops answering (a collective fails or times out) raises
    RankFailedError from `run`, and calls `on_failure(message)` when set (the pod sets it
    to end the process). Rank 0's own error in a step (out of memory, say) is raised as it
    is, as at TP 1, after the other ranks are told to drop the step (group.py)."""

    def __init__(self, config: EngineConfig) -> None:
        size, timeout = config.tensor_parallel_size, config.tensor_parallel_timeout_s
        self.on_failure = None
        self._threads = torch.get_num_threads()
        self._lock = threading.Lock()
        self._last = time.monotonic()
        self._closed = threading.Event()
        self.failure: str | None = None
        self.ranks = None
        group = None
        if torch.device(config.device).type == "cpu":
            torch.set_num_threads(1)  # one core per rank: ranks on one host share its cores
        try:
            self.ranks = RankProcesses(config, self._rank_failed)
            group = join_group(0, size, self.ranks.port, torch.device(config.device), timeout)
            super().__init__(config, group)
        except Exception as err:
            # Nothing may outlive a failed start: the ranks would wait out the start
            # timeout, and the thread count would stay at one.
            described = self.ranks.describe() if self.ranks is not None else "no rank started"
            self._closed.set()
            if self.ranks is not None:
                self.ranks.kill()
            if group is not None:
                group.leave()
            torch.set_num_threads(self._threads)
            raise RankFailedError(f"tensor-parallel start failed: {err} ({described})") from err
        self._pinger = threading.Thread(target=self._ping_loop, name="tp-ping", daemon=True)
        self._pinger.start()
        # An offline LLM is seldom closed: stop the ranks cleanly before multiprocessing's
        # own exit handler terminates them (which would read as a failure).
        atexit.register(self.close)

    def run(self, inputs: StepInputs, image_rows: list) -> torch.Tensor:
        dest, source = flatten_images(image_rows, inputs.meta.query_starts)
        message = StepMessage(
            inputs.input_ids, inputs.positions, inputs.meta, inputs.sample_rows, dest, source,
            inputs.state_slots,
        )  # fmt: skip
        journal = self.journal
        if journal:
            message.journal = list(journal)
        with self._collective():
            self.channel.send(message)
            if journal:  # sent: the others replay it (kept for the next step otherwise)
                del journal[: len(message.journal)]
            return self.forward(message)

    @contextmanager
    def _collective(self):
        """Hold the group for one exchange; a collective's error (a dead peer, a timeout)
        becomes RankFailedError naming the ranks. Any other error is rank 0's own: the
        others drop the exchange, and the error goes on as it is."""
        with self._lock:
            if self.failure is not None:
                raise RankFailedError(self.failure)
            try:
                yield
            except CollectiveError as err:
                raise self._failed_collective(err) from err
            except BaseException as err:
                log.warning("rank 0 failed in a step (%s); the other ranks drop it", err)
                try:
                    self.group.drop_step()
                except CollectiveError as failed:
                    raise self._failed_collective(failed) from err
                raise
            finally:
                self._last = time.monotonic()

    def _failed_collective(self, err: CollectiveError) -> RankFailedError:
        message = f"tensor-parallel step failed: {self.ranks.describe()} ({err})"
        self._rank_failed(message)
        return RankFailedError(message)

    def _ping_loop(self) -> None:
        interval = self.config.tensor_parallel_timeout_s / 4
        while not self._closed.wait(interval / 2):
            if time.monotonic() - self._last < interval:
                continue
            try:
                with self._collective():
                    if self._closed.is_set():
                        return
                    self.channel.send_control(PING)
                    self.group.ping()
            except RankFailedError:
                return

    def _rank_failed(self, message: str) -> None:
        if self.failure is not None or self._closed.is_set():
            return
        self.failure = message
        log.error("%s", message)
        if self.on_failure is not None:
            self.on_failure(message)

    def close(self) -> None:
        """Stop the other ranks (a STOP step, then a bounded join) and leave the group."""
        if self._closed.is_set():
            return
        atexit.unregister(self.close)
        with self._lock:
            self._closed.set()
            if self.failure is None:
                with suppress(RuntimeError):  # a rank already gone: stop() reaps it
                    self.channel.send_control(STOP)
        self.ranks.stop()
        self.group.leave()
        torch.set_num_threads(self._threads)
