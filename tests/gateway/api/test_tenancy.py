"""Tenant salts through the gateway (scripted pod and encoder on real gRPC, real cache):
what Generate and Encode carry, the per-salt prefix index, and the X-Iris-Pod header."""

import time

import pytest

from gateway.tenancy import Tenancy, tenant_salt
from iris.multimodal import block_hashes, image_identity
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
def fresh(qwen_gateway_parts):
    pod, encoder = qwen_gateway_parts["pod"], qwen_gateway_parts["encoder"]
    pod.reset()
    encoder.reset()
    yield pod, encoder


def test_a_cache_salt_goes_into_generate_encode_and_the_identity(
    client, model_name, fresh, qwen_adapter
):
    pod, encoder = fresh
    image = png_bytes(72, 72, "teal")
    body = {
        "model": model_name,
        "messages": [image_message(data_url(image))],
        "cache_salt": "tenant-a",
    }
    assert client.post("/v1/chat/completions", json=body).status_code == 200
    salt = tenant_salt(Tenancy.SHARED, "tenant-a", None)
    (request,) = pod.requests
    assert request.cache_salt == salt
    assert request.items[0].identity == image_identity(image, qwen_adapter.fingerprint, salt)
    eventually(lambda: len(encoder.requests) == 1)
    assert encoder.requests[0].identity_salt == salt
    # Unsalted, the same image is another item, encoded on its own.
    plain = {"model": model_name, "messages": body["messages"]}
    assert client.post("/v1/chat/completions", json=plain).status_code == 200
    assert pod.requests[1].cache_salt == b""
    assert pod.requests[1].items[0].identity == image_identity(image, qwen_adapter.fingerprint)
    eventually(lambda: len(encoder.requests) == 2)
    assert encoder.requests[1].identity_salt == b""


def test_the_prefix_index_is_per_salt(client, model_name, fresh):
    """The pod holds the unsalted prompt's blocks: an unsalted request needs no encoding
    (its image is in the pod's prefix), a salted one with the same image still does."""
    pod, encoder = fresh
    image = png_bytes(76, 76, "olive")
    messages = [image_message(data_url(image))]
    gateway = client.app.state.gateway
    prompt = client.portal.call(gateway.prompts.chat, messages)
    address = gateway.pods()[0].address
    hashes = block_hashes(gateway.fingerprint, prompt.input_ids, pod.script.page_size)
    seq = gateway.index.seq(address) + 1
    pod.events.put(llm_pb2.KVEventBatch(events=[llm_pb2.KVEvent(seq=seq, block_hashes=hashes)]))
    eventually(lambda: gateway.index.seq(address) == seq)
    salted = {"model": model_name, "messages": messages, "cache_salt": "tenant-b"}
    assert client.post("/v1/chat/completions", json=salted).status_code == 200
    eventually(lambda: len(encoder.requests) == 1)
    shared = {"model": model_name, "messages": messages}
    assert client.post("/v1/chat/completions", json=shared).status_code == 200
    time.sleep(0.2)  # an Encode would be sent without being awaited; none may come
    assert len(encoder.requests) == 1


def test_per_key_tenancy_salts_by_the_api_key(qwen_gateway_parts, model_name, fresh):
    pod, _ = fresh
    keys = ["key-one", "key-two"]
    with make_client(qwen_gateway_parts, api_keys=keys, tenancy="per-key") as client:
        wait_ready(client)
        body = {"model": model_name, "messages": [{"role": "user", "content": "hi"}]}
        for key in keys:
            headers = {"Authorization": f"Bearer {key}"}
            assert client.post("/v1/chat/completions", json=body, headers=headers).is_success
        chosen = {**body, "cache_salt": "tenant-a"}
        headers = {"Authorization": "Bearer key-one"}
        assert client.post("/v1/chat/completions", json=chosen, headers=headers).is_success
    salts = [request.cache_salt for request in pod.requests]
    assert salts[0] == tenant_salt(Tenancy.PER_KEY, None, "key-one")
    assert len(set(salts)) == 3 and b"" not in salts
    # A cache_salt stays inside its key's space: it is not the salt shared tenancy gives it.
    assert salts[2] != tenant_salt(Tenancy.SHARED, "tenant-a", None)


def test_the_pod_header_is_off_unless_debugging(client, qwen_gateway_parts, model_name):
    body = {"model": model_name, "messages": [{"role": "user", "content": "hi"}]}
    response = client.post("/v1/chat/completions", json=body)
    assert response.status_code == 200 and "x-iris-pod" not in response.headers
    stream = client.post("/v1/chat/completions", json={**body, "stream": True})
    assert stream.status_code == 200 and "x-iris-pod" not in stream.headers
    completion = {"model": model_name, "prompt": "hi"}
    assert "x-iris-pod" not in client.post("/v1/completions", json=completion).headers
    with make_client(qwen_gateway_parts, debug_pod_header=True) as debugging:
        wait_ready(debugging)
        response = debugging.post("/v1/chat/completions", json=body)
        assert response.headers["x-iris-pod"] == qwen_gateway_parts["pod_address"]
