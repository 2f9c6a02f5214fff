"""Chat completions through the gateway to a scripted pod (real gRPC) and a real cache."""

import json
import threading

import grpc
import numpy as np
import pytest
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from iris.multimodal import block_hashes
from iris.telemetry import setup_tracing
from llm_svc.proto import llm_pb2
from tests.gateway.helpers import (
    data_url,
    eventually,
    image_message,
    make_client,
    png_bytes,
    wait_ready,
)


@pytest.fixture(autouse=True)
def fresh_script(qwen_gateway_parts, client):
    pod, encoder = qwen_gateway_parts["pod"], qwen_gateway_parts["encoder"]
    # The gateway answers without awaiting its Encode (a real pod waits for the embedding,
    # this scripted one does not), so a past test's Encode may still be on its way: let it
    # land before the scripted services forget what they saw, or it lands in this test.
    dispatcher = client.app.state.gateway.dispatcher
    eventually(lambda: dispatcher.background == 0)
    pod.reset(text=["Hello", " world"])
    encoder.reset()
    yield pod, encoder


def sse_events(response) -> list:
    lines = [line for line in response.text.split("\n") if line.startswith("data: ")]
    assert lines[-1] == "data: [DONE]"
    return [json.loads(line[6:]) for line in lines[:-1]]


def test_text_chat_returns_message_usage_and_sends_trace_context(client, model_name, fresh_script):
    pod, _ = fresh_script
    body = {"model": model_name, "messages": [{"role": "user", "content": "hi"}], "seed": 3}
    response = client.post("/v1/chat/completions", json=body)
    assert response.status_code == 200, response.text
    data = response.json()
    assert data["object"] == "chat.completion"
    assert data["choices"][0]["message"] == {"role": "assistant", "content": "Hello world"}
    assert data["choices"][0]["finish_reason"] == "stop"
    (request,) = pod.requests
    assert data["usage"] == {
        "prompt_tokens": len(request.input_ids),
        "completion_tokens": 2,
        "total_tokens": len(request.input_ids) + 2,
        "prompt_tokens_details": {"cached_tokens": 0},
    }
    assert request.sampling.seed == 3 and request.sampling.max_tokens > 0


def test_one_trace_from_the_client_through_the_pod_with_genai_attributes(
    client, model_name, fresh_script
):
    pod, _ = fresh_script
    exporter = InMemorySpanExporter()
    setup_tracing("iris-gateway-test", extra_processors=[SimpleSpanProcessor(exporter)])
    trace_id = "4bf92f3577b34da6a3ce929d0e0e4736"
    headers = {"traceparent": f"00-{trace_id}-00f067aa0ba902b7-01"}
    body = {
        "model": model_name,
        "messages": [image_message(data_url(png_bytes(33, 33, "pink")))],
        "top_p": 0.5,
    }
    assert client.post("/v1/chat/completions", json=body, headers=headers).status_code == 200
    sent = pod.metadata[0]["traceparent"]
    assert sent.split("-")[1] == trace_id
    assert pod.requests[0].trace.traceparent == sent
    spans = {span.name: span for span in exporter.get_finished_spans()}
    server, inference = spans["POST /v1/chat/completions"], spans[f"chat {model_name}"]
    assert {format(s.context.trace_id, "032x") for s in (server, inference)} == {trace_id}
    assert server.kind is SpanKind.SERVER
    assert spans["cache.reserve"].parent.span_id == inference.context.span_id
    attributes = inference.attributes
    assert attributes["gen_ai.operation.name"] == "chat"
    assert attributes["gen_ai.request.model"] == model_name
    assert attributes["gen_ai.request.top_p"] == 0.5
    assert attributes["gen_ai.usage.output_tokens"] == 2
    assert attributes["gen_ai.response.finish_reasons"] == ("stop",)


def test_image_chat_reserves_encodes_once_and_sends_padded_items(
    client, model_name, fresh_script, qwen_adapter
):
    pod, encoder = fresh_script
    image = png_bytes(120, 90, "green")
    body = {"model": model_name, "messages": [image_message(data_url(image))]}
    assert client.post("/v1/chat/completions", json=body).status_code == 200
    (request,) = pod.requests
    (item,) = request.items
    assert request.fingerprint == qwen_adapter.fingerprint
    ids = np.array(request.input_ids)
    span = ids[item.offsets[0].start : item.offsets[0].end + 1]
    assert len(span) == item.token_count and span.min() >= 1_000_000
    # The encoder got the image once (RESERVED; sent without awaiting, so it may land
    # after the response); the second request finds it PENDING.
    dispatcher = client.app.state.gateway.dispatcher
    eventually(lambda: dispatcher.background == 0)
    assert [r.items[0].image for r in encoder.requests] == [image]
    assert client.post("/v1/chat/completions", json=body).status_code == 200
    eventually(lambda: dispatcher.background == 0)
    assert len(encoder.requests) == 1


def test_an_image_already_in_the_pods_prefix_is_not_reserved(client, model_name, fresh_script):
    pod, encoder = fresh_script
    body = {"model": model_name, "messages": [image_message(data_url(png_bytes(80, 80, "navy")))]}
    gateway = client.app.state.gateway
    # Learn the padded ids, then tell the index (through a KV event) the pod holds them.
    first_pod_request = client.portal.call(gateway.prompts.chat, body["messages"])
    address = gateway.pods()[0].address
    hashes = block_hashes(gateway.fingerprint, first_pod_request.input_ids, pod.script.page_size)
    seq = gateway.index.seq(address) + 1
    pod.events.put(llm_pb2.KVEventBatch(events=[llm_pb2.KVEvent(seq=seq, block_hashes=hashes)]))
    eventually(lambda: gateway.index.seq(address) == seq)
    assert client.post("/v1/chat/completions", json=body).status_code == 200
    eventually(lambda: gateway.dispatcher.background == 0)
    assert encoder.requests == []  # no reservation, no ViT work
    assert len(pod.requests) == 1


def test_stream_sends_role_content_finish_usage_then_done(client, model_name):
    body = {
        "model": model_name,
        "messages": [{"role": "user", "content": "hi"}],
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    response = client.post("/v1/chat/completions", json=body)
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/event-stream")
    events = sse_events(response)
    assert events[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    text = "".join(e["choices"][0]["delta"].get("content", "") for e in events if e["choices"])
    assert text == "Hello world"
    assert events[-2]["choices"][0]["finish_reason"] == "stop"
    assert events[-1]["choices"] == [] and events[-1]["usage"]["completion_tokens"] == 2


def test_a_pod_refusal_is_an_http_status_even_when_streaming(client, model_name, fresh_script):
    pod, _ = fresh_script
    pod.script.refusals.append((grpc.StatusCode.INVALID_ARGUMENT, "image 0 failed: bad pixels"))
    body = {"model": model_name, "messages": [{"role": "user", "content": "hi"}], "stream": True}
    response = client.post("/v1/chat/completions", json=body)
    assert response.status_code == 400
    assert "bad pixels" in response.json()["error"]["message"]


def test_embedding_missing_is_retried_once(client, model_name, fresh_script):
    pod, _ = fresh_script
    missing = (grpc.StatusCode.FAILED_PRECONDITION, "embedding missing for item 0")
    pod.script.refusals.append(missing)
    body = {"model": model_name, "messages": [image_message(data_url(png_bytes(50, 50, "tan")))]}
    assert client.post("/v1/chat/completions", json=body).status_code == 200
    assert len(pod.requests) == 2
    pod.script.refusals.extend([missing, missing])
    response = client.post("/v1/chat/completions", json=body)
    assert response.status_code == 503
    assert "missing" in response.json()["error"]["message"]


def test_a_full_pod_is_429_with_retry_after(client, model_name, fresh_script):
    pod, _ = fresh_script
    pod.script.refusals.append((grpc.StatusCode.RESOURCE_EXHAUSTED, "queue full"))
    body = {"model": model_name, "messages": [{"role": "user", "content": "hi"}]}
    response = client.post("/v1/chat/completions", json=body)
    assert response.status_code == 429
    assert int(response.headers["retry-after"]) >= 1


def test_an_image_the_encoder_fails_is_400(client, model_name, fresh_script):
    pod, encoder = fresh_script
    pod.script.accept_delay_s = 1.0  # a real pod waits for the embedding before accepting
    encoder.fail = "cannot decode image: truncated"
    body = {"model": model_name, "messages": [image_message(data_url(png_bytes(70, 70, "gold")))]}
    response = client.post("/v1/chat/completions", json=body)
    assert response.status_code == 400
    assert "truncated" in response.json()["error"]["message"]


def test_an_embedding_the_cache_would_not_store_is_503_with_retry_after(
    client, model_name, fresh_script
):
    pod, encoder = fresh_script
    pod.script.accept_gate = threading.Event()  # the pod never accepts before the answer
    encoder.fail = "cache put failed: entry over the memory store capacity"
    encoder.retryable = True
    body = {"model": model_name, "messages": [image_message(data_url(png_bytes(72, 70, "gold")))]}
    try:
        response = client.post("/v1/chat/completions", json=body)
    finally:
        pod.script.accept_gate.set()
    assert response.status_code == 503, response.text
    assert response.json()["error"]["code"] == "cache_unavailable"
    assert int(response.headers["retry-after"]) >= 1


def test_an_encode_that_never_ran_gives_its_lease_back(
    client, model_name, fresh_script, qwen_gateway_parts
):
    from embedding_cache_svc.client import CacheClient, Status
    from iris.multimodal import image_identity

    pod, encoder = fresh_script
    pod.script.accept_delay_s = 1.0  # a real pod waits for the embedding before accepting
    encoder.unavailable = True
    image = png_bytes(71, 70, "teal")
    body = {"model": model_name, "messages": [image_message(data_url(image))]}
    response = client.post("/v1/chat/completions", json=body)
    assert response.status_code == 503
    assert response.json()["error"]["code"] == "encoder_unavailable"
    adapter = qwen_gateway_parts["adapter"]
    key = image_identity(image, adapter.fingerprint)
    with CacheClient(qwen_gateway_parts["cache_address"], adapter.fingerprint) as cache:
        # Not leased any more (a probe: Wait with no time left): the next request encodes it
        # at once rather than waiting out the lease on an entry that would never come.
        eventually(lambda: cache.wait([(key, 0)], 0.0) == {key: Status.FREE})
    encoder.unavailable = False
    assert client.post("/v1/chat/completions", json=body).status_code == 200
    assert len(encoder.requests) == 2


def test_n_choices_use_consecutive_seeds_and_logprobs(client, model_name, fresh_script):
    pod, _ = fresh_script
    body = {
        "model": model_name,
        "messages": [{"role": "user", "content": "hi"}],
        "n": 2,
        "seed": 10,
        "logprobs": True,
        "top_logprobs": 1,
    }
    data = client.post("/v1/chat/completions", json=body).json()
    assert [c["index"] for c in data["choices"]] == [0, 1]
    assert sorted(r.sampling.seed for r in pod.requests) == [10, 11]
    content = data["choices"][0]["logprobs"]["content"]
    assert content[0]["token"] == "Hello" and content[0]["logprob"] == -0.5
    assert content[0]["top_logprobs"][0]["bytes"] == list(b"Hello")
    assert data["usage"]["completion_tokens"] == 4
    assert data["usage"]["prompt_tokens"] == len(pod.requests[0].input_ids)


def test_api_keys_are_enforced_when_configured(qwen_gateway_parts, model_name):
    with make_client(qwen_gateway_parts, api_keys=["sekret"]) as keyed:
        wait_ready(keyed)
        body = {"model": model_name, "messages": [{"role": "user", "content": "hi"}]}
        assert keyed.post("/v1/chat/completions", json=body).status_code == 401
        wrong = {"Authorization": "Bearer nope"}
        assert keyed.post("/v1/chat/completions", json=body, headers=wrong).status_code == 401
        right = {"Authorization": "Bearer sekret"}
        assert keyed.post("/v1/chat/completions", json=body, headers=right).status_code == 200
        assert keyed.get("/v1/models").status_code == 401
        assert keyed.get("/healthz").status_code == 200


def test_no_request_leaves_an_in_flight_ticket_open(client, model_name, fresh_script):
    """Routing counts each placement until its request ends; every way a request can end
    (done, streamed, refused, invalid after routing would have happened, n choices, a
    completions batch with a bad prompt, the client leaving mid-stream) closes it."""
    pod, _ = fresh_script
    gateway = client.app.state.gateway
    (routed_pod,) = gateway.registry.pods()

    def open_tickets() -> int:
        return routed_pod.inflight.view().requests

    hi = [{"role": "user", "content": "hi"}]
    chat = "/v1/chat/completions"
    assert client.post(chat, json={"model": model_name, "messages": hi}).status_code == 200
    streamed = client.post(chat, json={"model": model_name, "messages": hi, "stream": True})
    assert streamed.status_code == 200
    assert client.post(chat, json={"model": model_name, "messages": hi, "n": 2}).status_code == 200
    bad_stop = {"model": model_name, "messages": hi, "stop": [""]}
    assert client.post(chat, json=bad_stop).status_code == 400
    pod.script.refusals.append((grpc.StatusCode.RESOURCE_EXHAUSTED, "queue full"))
    assert client.post(chat, json={"model": model_name, "messages": hi}).status_code == 429
    # The second prompt is too long: the first must not stay routed.
    batch = {"model": model_name, "prompt": ["hello", "x " * 5000], "max_tokens": 2}
    assert client.post("/v1/completions", json=batch).status_code == 400
    pod.script.text = ["tok"] * 200
    body = {"model": model_name, "messages": hi, "stream": True}
    with client.stream("POST", chat, json=body) as response:
        for line in response.iter_lines():
            if line.startswith("data: "):
                break  # leave after the first event
    eventually(lambda: open_tickets() == 0)
