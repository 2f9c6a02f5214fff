"""The pod watcher against a real gRPC server: handshake, refusal, KV events and resync."""

import asyncio

import grpc
import pytest

from gateway.routing.kv_index import KVIndex, Source
from gateway.routing.pods import Pod
from gateway.routing.watcher import PodWatcher
from iris.multimodal import AttentionLayer, LayerKind, PrefixResumeRule
from llm_svc.proto import llm_pb2, llm_pb2_grpc
from tests.gateway.fake_services import PodScript, serve_pod

FINGERPRINT = bytes(range(32))
A, B, C = (bytes([i]) * 16 for i in range(1, 4))


def batch(*events):
    return llm_pb2.KVEventBatch(
        events=[
            llm_pb2.KVEvent(seq=seq, kind=kind, block_hashes=blocks) for seq, kind, blocks in events
        ]
    )


@pytest.fixture
def fake_pod():
    server, address, pod = serve_pod(PodScript(FINGERPRINT, snapshot=(5, [A])))
    yield address, pod
    server.stop(0)


async def eventually(condition, timeout=60.0):
    for _ in range(int(timeout / 0.02)):
        if condition():
            return
        await asyncio.sleep(0.02)
    raise AssertionError("condition not reached")


async def start(address, index, fingerprint=FINGERPRINT):
    channel = grpc.aio.insecure_channel(address)
    pod = Pod(address)
    watcher = PodWatcher(
        pod, llm_pb2_grpc.LLMStub(channel), index, fingerprint, poll_interval_s=0.05, timeout_s=2
    )
    return pod, channel, asyncio.create_task(watcher.run())


async def test_events_follow_the_snapshot_and_a_gap_resyncs(fake_pod):
    address, server_pod = fake_pod
    index = KVIndex()
    pod, channel, task = await start(address, index)
    try:
        await eventually(lambda: pod.usable and index.source(address) is Source.EVENTS)
        assert pod.page_size == 4 and pod.name == "fake"
        assert index.blocks(address) == {A}
        server_pod.events.put(batch((6, llm_pb2.KVEvent.STORED, [B])))
        await eventually(lambda: index.blocks(address) == {A, B})
        server_pod.events.put(batch((7, llm_pb2.KVEvent.REMOVED, [A])))
        await eventually(lambda: index.blocks(address) == {B})
        # Seq 9 after 7: a gap. The watcher takes a new snapshot.
        server_pod.script.snapshot = (20, [C])
        server_pod.events.put(batch((9, llm_pb2.KVEvent.STORED, [A])))
        await eventually(lambda: index.seq(address) == 20)
        assert index.blocks(address) == {C}
        assert server_pod.snapshots >= 2
    finally:
        task.cancel()
        await channel.close()


async def test_a_pod_with_another_fingerprint_is_refused(fake_pod):
    address, _ = fake_pod
    pod, channel, task = await start(address, KVIndex(), fingerprint=bytes(32))
    try:
        await asyncio.wait_for(task, 5)  # refusal ends the watcher
        assert pod.refused and "fingerprint" in pod.refused
        assert not pod.usable
    finally:
        await channel.close()


async def test_a_pod_without_events_routes_on_decisions():
    server, address, _ = serve_pod(PodScript(FINGERPRINT, events_unimplemented=True))
    index = KVIndex()
    pod, channel, task = await start(address, index)
    try:
        await eventually(lambda: pod.usable)
        await asyncio.sleep(0.2)
        assert index.source(address) is Source.DECISIONS
        index.record_decision(address, [A])
        assert index.matched_blocks(address, [A]) == 1
    finally:
        task.cancel()
        await channel.close()
        server.stop(0)


async def test_an_unreachable_pod_is_not_usable():
    index = KVIndex()
    pod, channel, task = await start("127.0.0.1:1", index)
    try:
        await asyncio.sleep(0.3)
        assert not pod.usable and pod.refused is None
    finally:
        task.cancel()
        await channel.close()


async def test_each_poll_publishes_the_pods_in_flight_count(fake_pod):
    from prometheus_client import REGISTRY

    from gateway import metrics
    from iris import metrics as names

    def shown(name, label="fake"):  # the name the fake pod reports; never its address
        return REGISTRY.get_sample_value(name, {names.LABEL_LLM_POD: label})

    address, _ = fake_pod
    pod, channel, task = await start(address, KVIndex())
    try:
        pod.inflight.open(120)
        streaming = pod.inflight.open(30)
        streaming.first_token()
        await eventually(lambda: shown(names.GATEWAY_POD_REQUESTS_IN_FLIGHT) == 2)
        assert shown(names.GATEWAY_POD_PREFILL_TOKENS_IN_FLIGHT) == 120
        streaming.close()
        await eventually(lambda: shown(names.GATEWAY_POD_REQUESTS_IN_FLIGHT) == 1)
        assert shown(names.GATEWAY_POD_REQUESTS_IN_FLIGHT, address) is None
    finally:
        task.cancel()
        await channel.close()
    metrics.forget_pod(pod.name)  # what the registry does when a pod leaves
    assert shown(names.GATEWAY_POD_REQUESTS_IN_FLIGHT) is None


async def test_the_pod_s_layers_reach_its_resume_rule():
    sliding = llm_pb2.AttentionLayer(kind=llm_pb2.AttentionLayer.SLIDING, window=8)
    full = llm_pb2.AttentionLayer(kind=llm_pb2.AttentionLayer.FULL)
    server, address, _ = serve_pod(PodScript(FINGERPRINT, layers=[sliding, full]))
    pod, channel, task = await start(address, KVIndex())
    try:
        await eventually(lambda: pod.usable)
        assert pod.resume_rule == PrefixResumeRule(
            4, (AttentionLayer(LayerKind.SLIDING, 8), AttentionLayer())
        )
    finally:
        task.cancel()
        await channel.close()
        server.stop(0)


async def test_a_pod_with_a_layer_kind_unknown_here_is_refused_by_name():
    newer = llm_pb2.AttentionLayer(kind=7, window=0)  # a kind a newer pod might report
    server, address, _ = serve_pod(PodScript(FINGERPRINT, layers=[newer]))
    pod, channel, task = await start(address, KVIndex())
    try:
        await asyncio.wait_for(task, 5)  # refusal ends the watcher
        assert "layer 0 has attention kind 7" in pod.refused
        assert not pod.usable
    finally:
        await channel.close()
        server.stop(0)
