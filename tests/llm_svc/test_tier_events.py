"""Tier moves as KV events (issue: KV beyond the device, part 3): the events a pod publishes,
through its event log and the wire, rebuild in the gateway's index exactly which blocks the
pod holds on its device and which in host memory only; pages written to the KV store are
announced once written; and the rates GetLoad reports are measured."""

from __future__ import annotations

import itertools

from gateway.routing.kv_index import KVIndex
from gateway.routing.watcher import event_records
from llm_svc.engine import EngineConfig, LLMEngine
from llm_svc.engine.host_tier import PAGE
from llm_svc.engine.kv_events import HostRemoved, HostStored, StoreStored
from llm_svc.engine.kv_store import KVStoreConfig
from llm_svc.proto import llm_pb2
from llm_svc.server.kv_events import KVEventLog
from llm_svc.server.service import _kv_event
from tests.llm_svc.checkpoints import tiny_checkpoint
from tests.llm_svc.conftest import greedy, run_all

PAGE_SIZE, VOCAB = 4, 300
_stores = itertools.count()


class Subscriber:
    """A gateway's view of one pod: its event log, sent over the wire, applied to an index."""

    def __init__(self) -> None:
        self.log = KVEventLog(capacity=10_000)
        self.index = KVIndex()
        self.index.load_snapshot("pod", 0, [])
        self.events: list = []

    def follow(self, engine: LLMEngine) -> None:
        events = engine.take_kv_events()
        self.events += events
        seen = self.index.seq("pod")
        self.log.publish(events)
        batch = llm_pb2.KVEventBatch(events=[_kv_event(r) for r in self.log.since(seen)])
        assert self.index.apply("pod", event_records(batch))

    def device(self, engine: LLMEngine) -> set[bytes]:
        cache = engine.blocks.cache
        return cache.block_hashes() - cache.host_block_hashes()


def _engine(**overrides) -> LLMEngine:
    args = dict(page_size=PAGE_SIZE, num_pages=12, max_num_seqs=2, max_model_len=44,
                dtype="float32", device="cpu", max_num_batched_tokens=16,
                host_kv_bytes=4 << 20)  # fmt: skip
    return LLMEngine(EngineConfig(tiny_checkpoint("llama"), **(args | overrides)))


def _conversations() -> tuple[list[int], list[list[int]], list[int]]:
    first = [(7 * i + 3) % VOCAB for i in range(26)]
    others = [[(11 * i + 5 * k + 1) % VOCAB for i in range(30)] for k in range(3)]
    return first, others, first + [(13 * i + 2) % VOCAB for i in range(6)]


def test_tier_moves_rebuild_device_and_host_blocks_in_the_gateways_index():
    engine, pod = _engine(), Subscriber()
    first, others, second = _conversations()
    try:
        for index, prompt in enumerate([first, *others]):
            run_all(engine, {f"turn{index}": (prompt, greedy(4))})
            pod.follow(engine)
        cache = engine.blocks.cache
        spilled = cache.host_block_hashes()
        assert spilled, "the other conversations pushed the first one's pages to host memory"
        assert any(isinstance(e, HostStored) for e in pod.events)
        assert pod.index.blocks("pod") == cache.block_hashes()
        assert pod.index.host_blocks("pod") == spilled
        first_hashes = cache.match(first)
        hashes = [node.block_hash for node in first_hashes]
        assert pod.index.device_blocks("pod", hashes) < len(hashes)
        assert pod.index.matched_blocks("pod", hashes) == len(hashes)
        # The log's snapshot (what a resyncing gateway loads) says the same.
        snap = pod.log.snapshot()
        assert set(snap.host) == spilled and set(snap.hashes) == cache.block_hashes()

        run_all(engine, {"second": (second, greedy(4))})
        pod.follow(engine)
        rates = engine.stats().rates
        host = engine.runner.host_tier
    finally:
        engine.close()
    assert any(isinstance(e, HostRemoved) for e in pod.events), "the reload is announced"
    assert pod.index.blocks("pod") == cache.block_hashes()
    assert pod.index.host_blocks("pod") == cache.host_block_hashes()
    assert pod.index.device_blocks("pod", hashes) == len(hashes)  # back on the device
    assert rates.prefill_tokens_per_s > 0 and rates.host_load_bytes_per_s > 0
    assert rates.kv_bytes_per_token == host.unit_bytes(PAGE) // PAGE_SIZE > 0
    assert rates.kv_store is False and rates.store_fetch_bytes_per_s == 0


def test_pages_written_to_the_store_are_announced_and_fetches_measured():
    store = KVStoreConfig("memory", url=f"tier-events-{next(_stores)}")
    first, _, second = _conversations()
    writer, pod = _engine(num_pages=32, kv_store=store), Subscriber()
    woken = []  # the pod's worker wakes to publish them, even with no step to come
    writer.kv_store.on_written = lambda: woken.append(True)
    try:
        run_all(writer, {"first": (first, greedy(4))})
        assert writer.kv_store.flush(), "the writes did not finish"
        assert woken
        pod.follow(writer)
        computed = writer.blocks.cache.block_hashes()
        assert writer.stats().rates.kv_store is True
    finally:
        writer.close()
    announced = {e.block_hash for e in pod.events if isinstance(e, StoreStored)}
    assert announced == computed
    assert pod.index.store_blocks(sorted(announced)) == len(announced)
    reader = _engine(num_pages=32, kv_store=store)
    try:
        out = run_all(reader, {"second": (second, greedy(4))})["second"]
        rates = reader.stats().rates
    finally:
        reader.close()
    assert out[-1].num_cached_tokens >= 6 * PAGE_SIZE  # fetched, not prefilled
    assert rates.store_fetch_bytes_per_s > 0
