"""The whole platform as real processes over mutual TLS, with suite-made certificates (one
per role), and the gateway requiring an API key (`iris up --api-key`): a chat with an
image crosses every hop (gateway → cache Reserve, gateway → encoder Encode, encoder →
cache Put, gateway → pod Generate, pod → cache BatchGet), and on those same processes a
wrong role is PERMISSION_DENIED and a caller without a client certificate fails the
handshake."""

from __future__ import annotations

import os

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from encoder_svc.proto import encoder_pb2, encoder_pb2_grpc
from iris.mtls import TLSFiles, role_hostname, sync_channel
from llm_svc.proto import llm_pb2, llm_pb2_grpc
from tests.e2e.helpers import image_message, image_png
from tests.fixtures.platform import start_platform

KINDS = ("gateway", "encoder", "cache", "llm")
API_KEY = "sk-e2e-" + os.urandom(8).hex()


@pytest.fixture(scope="module")
def tls_platform(tmp_path_factory, tiny_qwen2_vl_dir, role_certs):
    running = start_platform(
        tiny_qwen2_vl_dir,
        tmp_path_factory.mktemp("tls-platform"),
        extra_env={kind: role_certs.env(kind) for kind in KINDS},
        api_keys=(API_KEY,),
    )
    yield running
    running.stop()


def tls_as(role_certs, role: str) -> TLSFiles:
    paths = role_certs.roles[role]
    return TLSFiles(str(paths.cert), str(paths.key), str(role_certs.ca))


def test_a_chat_with_an_image_crosses_every_hop_over_mutual_tls(tls_platform):
    import openai

    client = openai.OpenAI(base_url=f"{tls_platform.gateway_url}/v1", api_key=API_KEY)
    reply = client.chat.completions.create(
        model=tls_platform.model_name,
        messages=image_message(image_png(2001)),
        max_tokens=4,
    )
    assert reply.choices[0].finish_reason in ("stop", "length")
    assert reply.usage.prompt_tokens > 10  # the image's tokens are in the prompt


def test_the_gateway_wants_the_api_key_and_the_demo_sends_it(tls_platform):
    import httpx

    from iris.up.demo import send_demo_requests

    assert httpx.get(f"{tls_platform.gateway_url}/v1/models").status_code == 401
    replies = send_demo_requests(tls_platform.gateway_url, api_key=API_KEY)
    assert [reply["object"] for _, reply in replies] == ["chat.completion"] * 2


def _denied(call) -> str:
    with pytest.raises(grpc.RpcError) as refused:
        call()
    assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED, refused.value
    return refused.value.details()


def test_an_encoder_certificate_may_not_generate(tls_platform, role_certs):
    address = tls_platform.llm_addresses[0]
    with sync_channel(address, tls_as(role_certs, "encoder"), "llm") as channel:
        stub = llm_pb2_grpc.LLMStub(channel)
        details = _denied(lambda: list(stub.Generate(llm_pb2.GenerateRequest(), timeout=10)))
        assert "role 'encoder' may not call /iris.llm.LLM/Generate" in details
        _denied(lambda: stub.GetKVSnapshot(llm_pb2.KVSnapshotRequest(), timeout=10))


def test_a_pod_certificate_may_not_encode(tls_platform, role_certs):
    address = tls_platform.addresses("encoder")[0]
    with sync_channel(address, tls_as(role_certs, "llm"), "encoder") as channel:
        stub = encoder_pb2_grpc.EncoderStub(channel)
        _denied(lambda: stub.Encode(encoder_pb2.EncodeRequest(), timeout=10))


def test_a_pod_certificate_may_not_store_embeddings(tls_platform, role_certs):
    import torch

    from embedding_cache_svc.client import CacheClient, CacheError

    fingerprint = bytes(32)
    with (
        CacheClient(
            tls_platform.cache_address, fingerprint, tls=tls_as(role_certs, "llm"), timeout_s=10
        ) as pod,
        pytest.raises(CacheError) as refused,
    ):
        pod.put(bytes(32), torch.zeros(2, 8), 2)
    assert refused.value.code == grpc.StatusCode.PERMISSION_DENIED


@pytest.mark.parametrize("kind", ["encoder", "cache", "llm"])
def test_no_client_certificate_fails_the_handshake(tls_platform, role_certs, kind):
    only_ca = grpc.ssl_channel_credentials(root_certificates=role_certs.ca.read_bytes())
    options = [("grpc.ssl_target_name_override", role_hostname(kind))]
    address = tls_platform.addresses(kind)[0]
    channel = grpc.secure_channel(address, only_ca, options=options)
    with channel, pytest.raises(grpc.RpcError) as failed:
        health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=10)
    assert failed.value.code() == grpc.StatusCode.UNAVAILABLE
    # ...while the same call with the role's own certificate is served.
    with sync_channel(address, tls_as(role_certs, "gateway"), kind) as channel:
        reply = health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(), timeout=10
        )
    assert reply.status == health_pb2.HealthCheckResponse.SERVING
