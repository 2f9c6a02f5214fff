"""A pod reports its model's real attention layers in GetModelInfo, and the gateway's pod
watcher builds from them the very resume rule the pod's block manager uses: a tiny Gemma 3
(two sliding layers of WINDOW tokens, one full) served by a real LLMServer on loopback."""

from __future__ import annotations

import asyncio

import grpc

from gateway.routing.kv_index import KVIndex
from gateway.routing.pods import Pod
from gateway.routing.watcher import PodWatcher
from iris.multimodal import AttentionLayer, LayerKind, PrefixResumeRule
from llm_svc.proto import llm_pb2, llm_pb2_grpc
from tests.llm_svc.family_checkpoints import WINDOW, family_checkpoint
from tests.llm_svc.server.pods import PodThread, pod_settings

SLIDING = AttentionLayer(LayerKind.SLIDING, WINDOW)
EXPECTED = (SLIDING, SLIDING, AttentionLayer())  # family_checkpoints' gemma3_text layer_types


async def test_a_gemma3_pod_reports_its_sliding_layers_and_the_gateway_builds_its_rule():
    pod_thread = PodThread(pod_settings(family_checkpoint("gemma3_text")))
    channel = grpc.aio.insecure_channel(pod_thread.address)
    try:
        stub = llm_pb2_grpc.LLMStub(channel)
        info = await stub.GetModelInfo(llm_pb2.ModelInfoRequest())
        assert [(layer.kind, layer.window) for layer in info.layers] == [
            (llm_pb2.AttentionLayer.SLIDING, WINDOW),
            (llm_pb2.AttentionLayer.SLIDING, WINDOW),
            (llm_pb2.AttentionLayer.FULL, 0),
        ]
        assert pod_thread.engine.resume_rule == PrefixResumeRule(4, EXPECTED)

        pod = Pod(pod_thread.address)
        watcher = PodWatcher(
            pod, stub, KVIndex(), info.fingerprint, poll_interval_s=0.05, timeout_s=5
        )
        task = asyncio.create_task(watcher.run())
        try:
            for _ in range(3000):  # the handshake, however slow the machine
                if pod.usable or pod.refused:
                    break
                await asyncio.sleep(0.02)
            assert pod.usable, pod.refused
            assert pod.layers == EXPECTED
            assert pod.resume_rule == pod_thread.engine.resume_rule
        finally:
            task.cancel()
    finally:
        await channel.close()
        pod_thread.close()
