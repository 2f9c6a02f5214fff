"""Dispatch across pods and encoders: retries before acceptance, encoder fallback."""

import grpc
import pytest

from tests.gateway.fake_services import PodScript, serve_encoder, serve_pod
from tests.gateway.helpers import data_url, image_message, make_client, png_bytes, wait_ready


@pytest.fixture
def two_pods(qwen_adapter):
    servers = [serve_pod(PodScript(qwen_adapter.fingerprint)) for _ in range(2)]
    yield [(address, pod) for _, address, pod in servers]
    for server, _, _ in servers:
        server.stop(0)


def wait_pods(client, count):
    import time

    for _ in range(200):
        if sum(p.usable for p in client.app.state.gateway.pods()) == count:
            return
        time.sleep(0.02)
    raise AssertionError(f"{count} pods never became usable")


def _one_refusal_is_served_by_the_other_pod(client, a, b, body, refusal) -> None:
    """Pod A refuses one call with `refusal` (code, details); round-robin sends one of two
    requests to A first. Both are served, the refused one on B: under an id of its own on
    the pod (every attempt has one) that names the same choice."""
    seen_by_a = len(a.requests)
    a.script.refusals.append(refusal)
    for _ in range(2):
        response = client.post("/v1/chat/completions", json=body)
        assert response.status_code == 200, response.text
    assert a.script.refusals == []
    refused = a.requests[seen_by_a].request_id
    choice, _, _ = refused.rpartition(".")
    assert choice.startswith("chatcmpl-") and choice.endswith("-0"), refused
    retried = [r.request_id for r in b.requests if r.request_id.rpartition(".")[0] == choice]
    assert len(retried) == 1 and retried[0] != refused, (refused, retried)


def test_an_unavailable_pod_is_skipped_before_acceptance(qwen_gateway_parts, two_pods, caplog):
    (a_address, a), (b_address, b) = two_pods
    parts = qwen_gateway_parts
    with make_client(
        parts, llm_addresses=[a_address, b_address], router_config="round-robin"
    ) as client:
        wait_pods(client, 2)
        a.script.refusals.append((grpc.StatusCode.UNAVAILABLE, "draining"))
        b.script.refusals.append((grpc.StatusCode.UNAVAILABLE, "draining"))
        body = {
            "model": qwen_gateway_parts["model_dir"].name,
            "messages": [{"role": "user", "content": "hi"}],
        }
        # Both refuse once: the request tries each pod and gets a 503. The pods' refusal
        # (a gRPC detail) and their addresses go to the log, not to the client.
        response = client.post("/v1/chat/completions", json=body)
        assert response.status_code == 503
        message = response.json()["error"]["message"]
        assert "no LLM pod accepted the request (request id chatcmpl-" in message
        for internal in ("draining", a_address, b_address, "UNAVAILABLE"):
            assert internal not in message
        assert "draining" in caplog.text
        # Only A refuses: whichever pod a request meets first, every request is served,
        # and the one A refused was retried on B for the same choice.
        _one_refusal_is_served_by_the_other_pod(
            client, a, b, body, (grpc.StatusCode.UNAVAILABLE, "draining")
        )


def test_a_pod_cancelling_before_acceptance_is_skipped(qwen_gateway_parts, two_pods):
    """A stopping pod's gRPC cancels a call its servicer has not taken (seen when a broken
    pod exits): that CANCELLED is the pod's, so the request goes to the other pod."""
    (a_address, a), (b_address, b) = two_pods
    with make_client(
        qwen_gateway_parts, llm_addresses=[a_address, b_address], router_config="round-robin"
    ) as client:
        wait_pods(client, 2)
        body = {
            "model": qwen_gateway_parts["model_dir"].name,
            "messages": [{"role": "user", "content": "hi"}],
        }
        _one_refusal_is_served_by_the_other_pod(
            client, a, b, body, (grpc.StatusCode.CANCELLED, "CANCELLED")
        )


def test_a_dead_encoder_is_skipped_and_none_left_is_503(qwen_gateway_parts):
    parts = dict(qwen_gateway_parts)
    server, live_address, encoder = serve_encoder()
    pod = parts["pod"]
    pod.script.accept_delay_s = 0.5
    try:
        body = {
            "model": parts["model_dir"].name,
            "messages": [image_message(data_url(png_bytes(41, 41, "olive")))],
        }
        with make_client(parts, encoder_addresses=["127.0.0.1:1", live_address]) as client:
            wait_ready(client)
            for _ in range(2):  # whichever encoder comes first, the live one gets the image
                body["messages"] = [image_message(data_url(png_bytes(41, 42 + _, "olive")))]
                assert client.post("/v1/chat/completions", json=body).status_code == 200
            assert len(encoder.requests) == 2
        with make_client(parts, encoder_addresses=["127.0.0.1:1"]) as client:
            wait_ready(client)
            body["messages"] = [image_message(data_url(png_bytes(43, 43, "olive")))]
            response = client.post("/v1/chat/completions", json=body)
            assert response.status_code == 503
            assert "encoder" in response.json()["error"]["message"]
    finally:
        pod.script.accept_delay_s = 0.0
        server.stop(0)


async def test_a_primed_first_chunk_is_charged_once(qwen_adapter):
    """`prime` reads a choice's first message before the stream begins; if another choice
    then fails, this attempt is given up, yet its tokens were computed: they are charged
    when read, by `prime` as by `responses`, and never twice."""
    import grpc.aio

    from gateway.dispatch import Generation
    from gateway.routing.pods import Pod
    from llm_svc.proto import llm_pb2, llm_pb2_grpc

    server, address, _ = serve_pod(PodScript(qwen_adapter.fingerprint))
    try:
        async with grpc.aio.insecure_channel(address) as channel:
            call = llm_pb2_grpc.LLMStub(channel).Generate(
                llm_pb2.GenerateRequest(request_id="r.0", input_ids=[1, 2, 3])
            )
            accepted = (await call.read()).accepted
            charged: list[int] = []
            generation = Generation("r", Pod(address), accepted, call, on_tokens=charged.append)
            await generation.prime()
            assert charged == [1]  # "Hello", read by prime
            texts = [m.tokens.text async for m in generation.responses() if m.HasField("tokens")]
    finally:
        server.stop(0)
    assert texts == ["Hello", " world"] and charged == [1, 1]
