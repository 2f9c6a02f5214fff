"""One task per LLM pod: handshake (GetModelInfo, fingerprint check), load polling, a watch
on the pod's gRPC health (readiness: a NOT_SERVING pod leaves routing the moment it says
so), and the KV event subscription that keeps the index precise (snapshot, then events; a
gap or a broken stream → fall back to decisions and resnapshot)."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import KW_ONLY, dataclass, field

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from gateway import metrics
from gateway.routing.kv_index import KVEventRecord, KVIndex
from gateway.routing.pods import Pod, PodRates
from iris.multimodal import AttentionLayer, LayerKind
from llm_svc.proto import llm_pb2, llm_pb2_grpc

log = logging.getLogger(__name__)
LLM_HEALTH_SERVICE = "iris.llm.LLM"  # the name an LLM pod's readiness is published under


_LAYER_KINDS = {
    llm_pb2.AttentionLayer.FULL: LayerKind.FULL,
    llm_pb2.AttentionLayer.SLIDING: LayerKind.SLIDING,
    llm_pb2.AttentionLayer.LINEAR: LayerKind.LINEAR,
}


def attention_layers(info: llm_pb2.ModelInfo) -> tuple[AttentionLayer, ...]:
    """The layers a pod reports, for its resumable-prefix rule. A kind this gateway does not
    know (a newer pod) raises ValueError naming it: the gateway could not count what that
    pod resumes, so it would leave images out of the Reserve that the pod needs."""
    layers = []
    for number, layer in enumerate(info.layers):
        kind = _LAYER_KINDS.get(layer.kind)
        if kind is None:
            raise ValueError(f"layer {number} has attention kind {layer.kind}, unknown here")
        layers.append(AttentionLayer(kind, layer.window, layer.snapshot_interval))
    return tuple(layers)


_EVENT = llm_pb2.KVEvent
# Tier moves of held blocks: (tier, stored).
_TIER_KINDS = {
    _EVENT.HOST_STORED: ("host", True),
    _EVENT.HOST_REMOVED: ("host", False),
    _EVENT.STORE_STORED: ("store", True),
}


def event_records(batch: llm_pb2.KVEventBatch) -> list[KVEventRecord]:
    records = []
    for event in batch.events:
        hashes = list(event.block_hashes)
        tier = _TIER_KINDS.get(event.kind)
        if tier is not None:
            records.append(KVEventRecord(event.seq, tier[1], hashes, tier=tier[0]))
            continue
        records.append(
            KVEventRecord(
                event.seq,
                event.kind in (_EVENT.STORED, _EVENT.SNAPSHOT_STORED),
                hashes,
                snapshot=event.kind == _EVENT.SNAPSHOT_STORED,
                window_removed=event.kind == _EVENT.WINDOW_REMOVED,
            )
        )
    return records


@dataclass(eq=False)
class PodWatcher:
    """Keeps one Pod's fields and its KV index entry current while the pod is listed."""

    pod: Pod
    stub: llm_pb2_grpc.LLMStub
    index: KVIndex
    fingerprint: bytes
    _: KW_ONLY
    poll_interval_s: float
    timeout_s: float
    health: health_pb2_grpc.HealthStub | None = None
    events_supported: bool = field(default=True, init=False)

    async def run(self) -> None:
        """Until cancelled: handshake, then poll load and follow KV events side by side."""
        while not await self.handshake():
            if self.pod.refused:
                return
            await asyncio.sleep(self.poll_interval_s)
        followers = [self._poll_load(), self._follow_events()]
        if self.health is not None:
            followers.append(self._watch_health())
        await asyncio.gather(*followers)

    async def handshake(self) -> bool:
        """GetModelInfo: a pod with another fingerprint is refused with a logged reason."""
        try:
            info = await self.stub.GetModelInfo(llm_pb2.ModelInfoRequest(), timeout=self.timeout_s)
        except grpc.aio.AioRpcError as err:
            self.pod.healthy = False
            log.debug("pod %s not ready: %s", self.pod.address, err.details())
            return False
        if info.fingerprint != self.fingerprint:
            self.pod.refused = (
                f"fingerprint {info.fingerprint.hex()[:16]}… differs from the gateway's "
                f"{self.fingerprint.hex()[:16]}… (another model or processor config)"
            )
            self.pod.healthy = False
            log.error("refusing LLM pod %s: %s", self.pod.address, self.pod.refused)
            return False
        if info.page_size == 0:
            self.pod.refused = "pod reports page_size 0"
            log.error("refusing LLM pod %s: %s", self.pod.address, self.pod.refused)
            return False
        try:
            layers = attention_layers(info)
        except ValueError as err:
            self.pod.refused = f"pod reports layers the gateway cannot resume from: {err}"
            log.error("refusing LLM pod %s: %s", self.pod.address, self.pod.refused)
            return False
        if info.pod_name and info.pod_name != self.pod.name:
            metrics.forget_pod(self.pod.name)  # series shown under the provisional name
            self.pod.name = info.pod_name
        self.pod.page_size = info.page_size
        self.pod.max_model_len = info.max_model_len
        self.pod.layers = layers
        self.pod.healthy = True
        log.info(
            "LLM pod %s (%s) ready, page size %d", self.pod.address, self.pod.name, info.page_size
        )
        return True

    async def _poll_load(self) -> None:
        while True:
            mine_before = self.pod.inflight.view()
            try:
                load = await self.stub.GetLoad(llm_pb2.LoadRequest(), timeout=self.timeout_s)
            except grpc.aio.AioRpcError as err:
                if self.pod.healthy:
                    log.warning("LLM pod %s unhealthy: %s", self.pod.address, err.details())
                self.pod.healthy = False
            else:
                if not self.pod.healthy:
                    # A pod coming back may be a new process: check who it is again.
                    await self.handshake()
                self.pod.load.kv_utilisation = load.kv_utilisation
                self.pod.load.running = load.running
                self.pod.load.waiting = load.waiting
                self.pod.load.pending_prefill_tokens = load.pending_prefill_tokens
                self.pod.load.rates = PodRates(
                    load.prefill_tokens_per_s, load.host_load_bytes_per_s,
                    load.store_fetch_bytes_per_s, load.kv_bytes_per_token, load.kv_store,
                )  # fmt: skip
                self.pod.inflight.observe(load.running, load.pending_prefill_tokens, mine_before)
            mine = self.pod.inflight.view()
            metrics.show_inflight(self.pod.name, mine.requests, mine.prefill_tokens)
            await asyncio.sleep(self.poll_interval_s)

    async def _watch_health(self) -> None:
        """Follow the pod's readiness: NOT_SERVING (its engine died or stalled, or it is
        stopping) takes it out of routing at once, SERVING brings it back. A pod without a
        health service is taken at its load polls' word."""
        address = self.pod.address
        request = health_pb2.HealthCheckRequest(service=LLM_HEALTH_SERVICE)
        while True:
            try:
                async for reply in self.health.Watch(request):
                    serving = reply.status == health_pb2.HealthCheckResponse.SERVING
                    if serving != self.pod.serving:
                        log.warning(
                            "LLM pod %s %s",
                            address,
                            "is ready again" if serving else "reports NOT_SERVING",
                        )
                    self.pod.serving = serving
            except grpc.aio.AioRpcError as err:
                if err.code() == grpc.StatusCode.UNIMPLEMENTED:
                    log.info("pod %s serves no gRPC health: following its load polls", address)
                    self.pod.serving = True
                    return
                log.debug("health watch of %s interrupted: %s", address, err.details())
            self.pod.serving = False  # the watch broke: not ready until it says so again
            await asyncio.sleep(self.poll_interval_s)

    async def _follow_events(self) -> None:
        address = self.pod.address
        while True:
            try:
                await self._sync_once()
            except grpc.aio.AioRpcError as err:
                self.index.fall_back(address)
                if err.code() == grpc.StatusCode.UNIMPLEMENTED:
                    log.info("pod %s publishes no KV events: routing on decisions", address)
                    self.events_supported = False
                    return
                log.debug("KV events of %s interrupted: %s", address, err.details())
            await asyncio.sleep(self.poll_interval_s)

    async def _sync_once(self) -> None:
        """Snapshot, then apply events until a gap (return) or the stream ends."""
        address = self.pod.address
        snapshot = await self.stub.GetKVSnapshot(
            llm_pb2.KVSnapshotRequest(), timeout=self.timeout_s
        )
        self.index.load_snapshot(
            address, snapshot.seq, snapshot.block_hashes, snapshot.snapshot_hashes,
            snapshot.windowless_hashes, snapshot.host_hashes,
        )  # fmt: skip
        metrics.POD_KV_EVENT_SEQ.labels(self.pod.name).set(snapshot.seq)
        stream = self.stub.StreamKVEvents(llm_pb2.KVEventsRequest(since_seq=snapshot.seq))
        try:
            async for batch in stream:
                if not self.index.apply(address, event_records(batch)):
                    log.info(
                        "KV event gap from %s after seq %d: resyncing",
                        address,
                        self.index.seq(address),
                    )
                    return
                metrics.POD_KV_EVENT_SEQ.labels(self.pod.name).set(self.index.seq(address))
            self.index.fall_back(address)
        finally:
            stream.cancel()
