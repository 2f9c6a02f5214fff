"""Scripted LLM pod and encoder servers (real gRPC on loopback) for the gateway's dispatch
and watcher tests: each answers what its test scripts (a refusal, an error at a given
point, a KV event stream), which a real pod cannot be made to do on demand. The
integration tests in test_openai_client.py and tests/e2e use the real processes."""

from __future__ import annotations

import queue
import threading
import time
from concurrent import futures
from dataclasses import dataclass, field

import grpc

from encoder_svc.proto import encoder_pb2, encoder_pb2_grpc
from llm_svc.proto import llm_pb2, llm_pb2_grpc


@dataclass
class PodScript:
    """What the fake pod does; tests edit it between requests."""

    fingerprint: bytes
    page_size: int = 4
    max_model_len: int = 4096
    layers: list[llm_pb2.AttentionLayer] = field(default_factory=list)  # GetModelInfo's
    refusals: list[tuple[grpc.StatusCode, str]] = field(default_factory=list)  # before accept
    text: list[str] = field(default_factory=lambda: ["Hello", " world"])
    finish_reason: str = "stop"
    cached_tokens: int = 0
    snapshot: tuple[int, list[bytes]] = (0, [])
    events_unimplemented: bool = False
    accept_delay_s: float = 0.0
    # When set, Generate accepts only once the test sets it (or after 30 s): a deterministic
    # "the pod has not accepted yet" for tests of what ends the wait first.
    accept_gate: threading.Event | None = None
    # Calls that fail UNAVAILABLE right after acceptance, before any token (a pod whose
    # engine step failed): this many upcoming ones.
    fail_after_accept: int = 0
    # Calls that fail UNAVAILABLE after their first token: this many upcoming ones.
    fail_after_first_token: int = 0
    # When set, a call holds its stream open after its first token until the test sets it
    # (or 180 s pass, longer than any test waits): a deterministic "still generating".
    token_gate: threading.Event | None = None


class EventFeed:
    """A fake pod's KV event batches (or None, which ends a stream), sent to every open
    StreamKVEvents stream as a real pod sends its events to every watcher: several gateways
    (a test's in-process one, a session's gateway process) may watch the same fake pod, and
    none may take a batch meant for all. A batch put while no stream is open waits for the
    next stream to open."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._streams: list[queue.Queue] = []
        self._backlog: list = []

    def put(self, batch) -> None:
        with self._lock:
            for stream in self._streams:
                stream.put(batch)
            if not self._streams:
                self._backlog.append(batch)

    def subscribe(self) -> queue.Queue:
        stream: queue.Queue = queue.Queue()
        with self._lock:
            for batch in self._backlog:
                stream.put(batch)
            self._backlog.clear()
            self._streams.append(stream)
        return stream

    def unsubscribe(self, stream: queue.Queue, unsent: list) -> None:
        """`stream` has closed; what it had not sent goes to the next stream if no other
        stream is open (one that is already had every batch)."""
        with self._lock:
            self._streams.remove(stream)
            if not self._streams:
                while not stream.empty():
                    unsent.append(stream.get_nowait())
                self._backlog.extend(unsent)


class FakePod(llm_pb2_grpc.LLMServicer):
    def __init__(self, script: PodScript) -> None:
        self.script = script
        self.requests: list[llm_pb2.GenerateRequest] = []
        self.metadata: list[dict] = []
        self.events = EventFeed()  # KVEventBatch, or None to end the streams
        self.snapshots = 0
        self.lock = threading.Lock()

    def reset(self, text: list[str] | None = None) -> None:
        """Between tests: no refusals, failures or accept delay, no recorded calls; `text`
        if given."""
        self.script.refusals.clear()
        self.script.accept_delay_s = 0.0
        self.script.accept_gate = None
        self.script.token_gate = None
        self.script.fail_after_accept = self.script.fail_after_first_token = 0
        if text is not None:
            self.script.text = text
        self.requests.clear()
        self.metadata.clear()

    def Generate(self, request, context):
        with self.lock:
            self.requests.append(request)
            self.metadata.append(dict(context.invocation_metadata()))
            refusal = self.script.refusals.pop(0) if self.script.refusals else None
        if refusal is not None:
            context.abort(*refusal)
        if self.script.accept_delay_s:
            time.sleep(self.script.accept_delay_s)
        if self.script.accept_gate is not None:
            self.script.accept_gate.wait(30)
        n = len(request.input_ids)
        yield llm_pb2.GenerateResponse(
            accepted=llm_pb2.Accepted(prompt_tokens=n, cached_tokens=self.script.cached_tokens)
        )
        with self.lock:
            fail = self.script.fail_after_accept > 0
            self.script.fail_after_accept -= int(fail)
        if fail:
            context.abort(grpc.StatusCode.UNAVAILABLE, "engine step failed: injected")
        for i, text in enumerate(self.script.text):
            logprobs = []
            if request.sampling.logprobs:
                top = [llm_pb2.TopLogprob(token_id=7, token=text, logprob=-0.5)]
                logprobs = [
                    llm_pb2.TokenLogprob(
                        token_id=7,
                        token=text,
                        logprob=-0.5,
                        top=top[: request.sampling.top_logprobs],
                    )
                ]
            yield llm_pb2.GenerateResponse(
                tokens=llm_pb2.TokenChunk(token_ids=[100 + i], text=text, logprobs=logprobs)
            )
            if i == 0:
                with self.lock:
                    fail = self.script.fail_after_first_token > 0
                    self.script.fail_after_first_token -= int(fail)
                if fail:
                    context.abort(grpc.StatusCode.UNAVAILABLE, "engine step failed: injected")
                if self.script.token_gate is not None:
                    self.script.token_gate.wait(180)
        usage = llm_pb2.Usage(
            prompt_tokens=n,
            completion_tokens=len(self.script.text),
            cached_tokens=self.script.cached_tokens,
        )
        yield llm_pb2.GenerateResponse(
            finished=llm_pb2.Finished(finish_reason=self.script.finish_reason, usage=usage)
        )

    def GetModelInfo(self, request, context):
        return llm_pb2.ModelInfo(
            model_id="tiny",
            fingerprint=self.script.fingerprint,
            page_size=self.script.page_size,
            max_model_len=self.script.max_model_len,
            pod_name="fake",
            layers=self.script.layers,
        )

    def GetLoad(self, request, context):
        return llm_pb2.Load(kv_utilisation=0.1, running=0, waiting=0)

    def GetKVSnapshot(self, request, context):
        if self.script.events_unimplemented:
            context.abort(grpc.StatusCode.UNIMPLEMENTED, "no KV events")
        self.snapshots += 1
        seq, hashes = self.script.snapshot
        return llm_pb2.KVSnapshot(seq=seq, block_hashes=hashes)

    def StreamKVEvents(self, request, context):
        if self.script.events_unimplemented:
            context.abort(grpc.StatusCode.UNIMPLEMENTED, "no KV events")
        stream, unsent = self.events.subscribe(), []
        try:
            while context.is_active():
                try:
                    batch = stream.get(timeout=0.1)
                except queue.Empty:
                    continue
                if not context.is_active():
                    # A stream whose gateway has gone (an earlier test's) must not swallow
                    # the batch meant for the gateway that subscribes next: hand it back.
                    unsent.append(batch)
                    return
                if batch is None:
                    return
                yield batch
        finally:
            self.events.unsubscribe(stream, unsent)


class FakeEncoder(encoder_pb2_grpc.EncoderServicer):
    def __init__(self, fail: str | None = None) -> None:
        self.requests: list[encoder_pb2.EncodeRequest] = []
        self.fail = fail
        self.retryable = False  # with `fail`: the put failed, nothing stored (not the image)
        self.unavailable = False  # answer UNAVAILABLE, as a dying encoder does

    def reset(self) -> None:
        """Between tests: answers every item, records nothing yet."""
        self.requests.clear()
        self.fail = None
        self.retryable = False
        self.unavailable = False

    def Encode(self, request, context):
        self.requests.append(request)
        if self.unavailable:
            context.abort(grpc.StatusCode.UNAVAILABLE, "encoder is shutting down")
        return encoder_pb2.EncodeResponse(
            results=[
                encoder_pb2.EncodeResult(
                    key=item.item.identity or item.item.hash.to_bytes(8, "big"),
                    ok=self.fail is None,
                    error=self.fail or "",
                    retryable=self.retryable,
                )
                for item in request.items
            ]
        )


def serve(add, servicer) -> tuple[grpc.Server, str]:
    """Start a thread-pool gRPC server on a free loopback port: (server, address)."""
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
    add(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    return server, f"127.0.0.1:{port}"


def serve_pod(script: PodScript) -> tuple[grpc.Server, str, FakePod]:
    pod = FakePod(script)
    server, address = serve(llm_pb2_grpc.add_LLMServicer_to_server, pod)
    return server, address, pod


def serve_encoder(fail: str | None = None) -> tuple[grpc.Server, str, FakeEncoder]:
    encoder = FakeEncoder(fail)
    server, address = serve(encoder_pb2_grpc.add_EncoderServicer_to_server, encoder)
    return server, address, encoder
