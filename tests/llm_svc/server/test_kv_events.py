"""KV events: a subscriber that replays them holds exactly the pod's cached blocks (with
the same chained hashes the gateway computes), and one that missed events resyncs."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from iris.multimodal import block_hashes
from llm_svc.engine import BlockRemoved, BlockStored
from llm_svc.engine.kv_events import SnapshotStored
from llm_svc.proto import llm_pb2, llm_pb2_grpc
from llm_svc.server.kv_events import KVEventLog
from llm_svc.server.step_failures import test_hooks_enabled
from tests.llm_svc.server.pods import PodThread, pod_settings, request


class Subscriber:
    """What a router keeps per pod: blocks and the last seq; False from `apply` on a gap."""

    def __init__(self) -> None:
        self.blocks: set[bytes] = set()
        self.seq = 0
        self.removed = 0
        self.gaps = 0

    def load(self, snapshot: llm_pb2.KVSnapshot) -> None:
        self.blocks, self.seq = set(snapshot.block_hashes), snapshot.seq

    def apply(self, batch: llm_pb2.KVEventBatch) -> bool:
        for event in batch.events:
            if event.seq != self.seq + 1:
                self.gaps += 1
                return False
            if event.kind == llm_pb2.KVEvent.STORED:
                self.blocks.update(event.block_hashes)
            else:
                self.blocks.difference_update(event.block_hashes)
                self.removed += len(event.block_hashes)
            self.seq = event.seq
        return True

    async def follow(self, stub: llm_pb2_grpc.LLMStub) -> None:
        """Snapshot, then events; on a gap, snapshot again (until cancelled)."""
        while True:
            self.load(await stub.GetKVSnapshot(llm_pb2.KVSnapshotRequest()))
            async for batch in stub.StreamKVEvents(llm_pb2.KVEventsRequest(since_seq=self.seq)):
                if not self.apply(batch):
                    break


def cached_hashes(engine) -> set[bytes]:
    return engine.blocks.cache.block_hashes()


def prompt(seed: int, length: int = 30) -> list[int]:
    return [(17 * i + 5 * seed) % 300 + 20 for i in range(length)]


async def run_workload(stub, count: int, first_seed: int = 0) -> None:
    for seed in range(first_seed, first_seed + count):
        async for _ in stub.Generate(request(f"kv-{seed}", prompt(seed), 4)):
            pass


async def caught_up(subscriber: Subscriber, pod: PodThread, timeout_s: float = 60.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while subscriber.seq != pod.server.kv_log.seq and loop.time() < deadline:
        await asyncio.sleep(0.02)


@pytest.fixture(scope="module")
def small_pod(tiny_idefics3_dir):
    """24 pages of 4 tokens: a handful of 34-token requests forces evictions."""
    running = PodThread(pod_settings(tiny_idefics3_dir, kv_num_pages=24, max_num_seqs=2))
    yield running
    running.close()


@pytest.fixture(scope="module")
def forgetful_pod(tiny_idefics3_dir):
    """Keeps only the last 2 event records, so a subscriber that lags loses events."""
    running = PodThread(pod_settings(tiny_idefics3_dir, kv_num_pages=24, kv_event_buffer=2))
    yield running
    running.close()


async def test_replayed_events_equal_the_pods_cache(small_pod):
    async with grpc.aio.insecure_channel(small_pod.address) as channel:
        stub = llm_pb2_grpc.LLMStub(channel)
        subscriber = Subscriber()
        follower = asyncio.create_task(subscriber.follow(stub))
        await run_workload(stub, 8)
        await caught_up(subscriber, small_pod)
        follower.cancel()
    assert subscriber.gaps == 0
    assert subscriber.removed > 0, "the workload was meant to evict pages"
    assert subscriber.blocks == small_pod.on_engine(cached_hashes)
    # The last prompt's full pages are cached under the chain the gateway computes.
    fingerprint = small_pod.engine.fingerprint
    expected = block_hashes(fingerprint, prompt(7), 4)
    assert set(expected) <= subscriber.blocks


async def test_a_subscriber_that_missed_events_resyncs_from_the_snapshot(forgetful_pod):
    async with grpc.aio.insecure_channel(forgetful_pod.address) as channel:
        stub = llm_pb2_grpc.LLMStub(channel)
        stale = Subscriber()
        stale.load(await stub.GetKVSnapshot(llm_pb2.KVSnapshotRequest()))
        await run_workload(stub, 6)  # many records; the log keeps 2
        stream = stub.StreamKVEvents(llm_pb2.KVEventsRequest(since_seq=stale.seq))
        assert not stale.apply(await stream.read()), "the first batch must show the gap"
        stream.cancel()
        follower = asyncio.create_task(stale.follow(stub))
        await run_workload(stub, 2, first_seed=6)
        await caught_up(stale, forgetful_pod)
        follower.cancel()
    assert stale.blocks == forgetful_pod.on_engine(cached_hashes)


async def test_since_seq_ahead_of_the_pod_is_out_of_range(stub, pod):
    ahead = pod.server.kv_log.seq + 10
    stream = stub.StreamKVEvents(llm_pb2.KVEventsRequest(since_seq=ahead))
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await stream.read()
    assert caught.value.code() == grpc.StatusCode.OUT_OF_RANGE
    assert str(ahead) in caught.value.details()


# --- the log itself ------------------------------------------------------------------


def test_chained_stores_and_runs_of_removals_become_one_record_each():
    log = KVEventLog(capacity=100)
    a, b, c, d = (bytes([n]) * 16 for n in range(1, 5))
    root = b"\0" * 16
    log.publish(
        [
            BlockStored(a, root, (1,)),
            BlockStored(b, a, (2,)),
            BlockStored(c, root, (3,)),  # a new chain
            BlockRemoved(b),
            BlockRemoved(a),
            BlockStored(d, c, (4,)),
        ]
    )
    records = log.since(0)
    assert [(r.seq, r.stored, r.block_hashes, r.parent_hash) for r in records] == [
        (1, True, (a, b), root),
        (2, True, (c,), root),
        (3, False, (b, a), b""),
        (4, True, (d,), c),
    ]
    seq, blocks, *_ = log.snapshot()
    assert seq == 4 and set(blocks) == {c, d}
    assert [r.seq for r in log.since(2)] == [3, 4]
    assert log.since(4) == []


def test_a_full_log_drops_the_oldest_records_and_the_gap_shows():
    log = KVEventLog(capacity=2)
    hashes = [bytes([n]) * 16 for n in range(1, 6)]
    for block in hashes:
        log.publish([BlockStored(block, b"\xff" * 16, ())])  # unchained: one record each
    assert [r.seq for r in log.since(0)] == [4, 5]  # 1..3 are gone: seq 1 is not next
    seq, blocks, *_ = log.snapshot()
    assert seq == 5 and set(blocks) == set(hashes)


async def test_reset_prefix_cache_announces_its_removals(small_pod):
    async with grpc.aio.insecure_channel(small_pod.address) as channel:
        stub = llm_pb2_grpc.LLMStub(channel)
        subscriber = Subscriber()
        follower = asyncio.create_task(subscriber.follow(stub))
        await run_workload(stub, 3, first_seed=20)
        await caught_up(subscriber, small_pod)
        held = small_pod.on_engine(cached_hashes)
        assert held and subscriber.blocks == held
        reply = await stub.ResetPrefixCache(llm_pb2.ResetPrefixCacheRequest())
        await caught_up(subscriber, small_pod)
        follower.cancel()
    assert reply.pages_freed == len(held)
    assert small_pod.on_engine(cached_hashes) == set() == subscriber.blocks
    engine = small_pod.engine
    assert small_pod.on_engine(lambda e: len(e.blocks.free_pages)) == engine.blocks.num_pages


async def test_a_silent_reset_is_a_test_hook_and_tells_no_subscriber(small_pod):
    servicer = small_pod.server.servicer
    async with grpc.aio.insecure_channel(small_pod.address) as channel:
        stub = llm_pb2_grpc.LLMStub(channel)
        await run_workload(stub, 2, first_seed=30)
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await stub.ResetPrefixCache(llm_pb2.ResetPrefixCacheRequest(silent=True))
        assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert "IRIS_TEST_HOOKS" in refused.value.details()
        held = small_pod.on_engine(cached_hashes)
        assert held, "refused: nothing was dropped"
        seq = small_pod.server.kv_log.seq
        servicer.test_hooks = True  # what IRIS_TEST_HOOKS=1 sets when the server starts
        try:
            reply = await stub.ResetPrefixCache(llm_pb2.ResetPrefixCacheRequest(silent=True))
        finally:
            servicer.test_hooks = False
        snapshot = await stub.GetKVSnapshot(llm_pb2.KVSnapshotRequest())
    assert reply.pages_freed == len(held)
    assert small_pod.on_engine(cached_hashes) == set()
    # No event: the log and its snapshot still show the pages the engine no longer holds.
    assert small_pod.server.kv_log.seq == seq
    assert held <= set(snapshot.block_hashes)


def test_test_hooks_are_on_only_with_the_flag():
    assert test_hooks_enabled({"IRIS_TEST_HOOKS": "1"})
    assert not test_hooks_enabled({})
    assert not test_hooks_enabled({"IRIS_TEST_HOOKS": "true"})


def test_snapshot_events_are_records_of_their_own_and_leave_with_their_block():
    """A hybrid model's SnapshotStored goes on the wire (SNAPSHOT_STORED); the log's
    snapshot lists the blocks that carry one, and a removed block takes its snapshot."""
    root, a, b = b"\x00" * 16, b"\x01" * 16, b"\x02" * 16
    log = KVEventLog(capacity=16)
    log.publish([BlockStored(a, root, (1,)), SnapshotStored(a), BlockStored(b, a, (2,))])
    records = log.since(0)
    assert [(r.stored, r.snapshot, r.block_hashes) for r in records] == [
        (True, False, (a,)),
        (True, True, (a,)),
        (True, False, (b,)),
    ]
    assert records[2].parent_hash == a
    seq, blocks, snapshots, *_ = log.snapshot()
    assert seq == 3 and set(blocks) == {a, b} and snapshots == [a]
    log.publish([BlockRemoved(a)])
    assert log.snapshot()[2] == []
