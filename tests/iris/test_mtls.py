"""Mutual TLS between services (iris/mtls), with real certificates made by the suite and a
real cache service on loopback: the right role is served, a wrong role gets
PERMISSION_DENIED, and a caller without a certificate from the CA fails the handshake."""

from __future__ import annotations

import grpc
import pytest
import torch

from embedding_cache_svc.client import CacheClient, CacheError, CacheUnavailable, Status
from iris.mtls import TLSFiles, sync_channel
from iris.mtls.roles import POLICY, allowed, role_from_sans
from iris.settings import SettingsError
from tests.embedding_cache_svc.helpers import FINGERPRINT, ServerThread, make_settings, new_key

HIDDEN = 8


def tls_of(role_certs, role: str) -> TLSFiles:
    paths = role_certs.roles[role]
    return TLSFiles(str(paths.cert), str(paths.key), str(role_certs.ca))


@pytest.fixture(scope="module")
def tls_cache(role_certs):
    paths = role_certs.roles["cache"]
    service = ServerThread(
        make_settings(
            "memory",
            tls_cert_file=str(paths.cert),
            tls_key_file=str(paths.key),
            tls_ca_file=str(role_certs.ca),
        )
    )
    yield service
    service.close()


def client(service, role_certs, role: str) -> CacheClient:
    return CacheClient(service.address, FINGERPRINT, tls=tls_of(role_certs, role), timeout_s=10)


def test_each_role_does_its_part(tls_cache, role_certs):
    key, tensor = new_key(), torch.randn(3, HIDDEN)
    with (
        client(tls_cache, role_certs, "gateway") as gateway,
        client(tls_cache, role_certs, "encoder") as encoder,
        client(tls_cache, role_certs, "llm") as pod,
    ):
        assert gateway.reserve([(key, 3)], lease_ms=10_000) == [Status.RESERVED]
        encoder.put(key, tensor, 3)
        got = pod.get_many([(key, 3)], HIDDEN, torch.float32)[key]
        assert torch.equal(got, tensor)
        assert gateway.get_many([(key, 3)], HIDDEN, torch.float32)[key] is not None
        assert pod.report_corrupt(key, "suspected").finding == "intact"  # not Delete


@pytest.mark.parametrize(
    ("role", "call"),
    [
        ("llm", lambda c, key: c.put(key, torch.zeros(2, HIDDEN), 2)),  # a pod storing
        ("gateway", lambda c, key: c.put(key, torch.zeros(2, HIDDEN), 2)),
        ("gateway", lambda c, key: c.fail(key, "poison", 1)),
        ("llm", lambda c, key: c.reserve([(key, 2)], lease_ms=1000)),
        ("llm", lambda c, key: c.abandon([key])),
        ("encoder", lambda c, key: c.get_many([(key, 2)], HIDDEN, torch.float32)),
        ("gateway", lambda c, key: c.delete([key])),
        ("llm", lambda c, key: c.delete([key])),
        ("encoder", lambda c, key: c.report_corrupt(key, "corrupt")),
        ("cache", lambda c, key: c.exists([key])),  # a role with no cache methods at all
    ],
)
def test_a_wrong_role_is_permission_denied(tls_cache, role_certs, role, call):
    with client(tls_cache, role_certs, role) as wrong, pytest.raises(CacheError) as refused:
        call(wrong, new_key())
    assert refused.value.code == grpc.StatusCode.PERMISSION_DENIED
    assert f"role {role!r} may not call" in str(refused.value)


def test_a_certificate_without_a_role_is_denied(tls_cache, role_certs):
    paths = role_certs.no_role
    tls = TLSFiles(str(paths.cert), str(paths.key), str(role_certs.ca))
    anonymous = CacheClient(tls_cache.address, FINGERPRINT, tls=tls, timeout_s=10)
    with anonymous, pytest.raises(CacheError) as refused:
        anonymous.exists([new_key()])
    assert refused.value.code == grpc.StatusCode.PERMISSION_DENIED


def _handshake_fails(channel: grpc.Channel) -> None:
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    with channel, pytest.raises(grpc.RpcError) as failed:
        health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=10)
    assert failed.value.code() == grpc.StatusCode.UNAVAILABLE


def test_no_client_certificate_fails_the_handshake(tls_cache, role_certs):
    only_ca = grpc.ssl_channel_credentials(root_certificates=role_certs.ca.read_bytes())
    options = [("grpc.ssl_target_name_override", "cache.iris.internal")]
    _handshake_fails(grpc.secure_channel(tls_cache.address, only_ca, options=options))


def test_plaintext_is_refused(tls_cache):
    _handshake_fails(grpc.insecure_channel(tls_cache.address))


def test_a_certificate_from_another_ca_fails_the_handshake(tls_cache, role_certs):
    paths = role_certs.stranger
    tls = TLSFiles(str(paths.cert), str(paths.key), str(role_certs.ca))
    _handshake_fails(sync_channel(tls_cache.address, tls, "cache"))


def test_the_client_checks_the_server_role(tls_cache, role_certs):
    """A gateway expecting an LLM pod refuses the cache's certificate."""
    _handshake_fails(sync_channel(tls_cache.address, tls_of(role_certs, "gateway"), "llm"))


def test_health_is_open_to_any_certificate_of_the_ca(tls_cache, role_certs):
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    paths = role_certs.no_role
    tls = TLSFiles(str(paths.cert), str(paths.key), str(role_certs.ca))
    with sync_channel(tls_cache.address, tls, "cache") as channel:
        reply = health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(), timeout=10
        )
    assert reply.status == health_pb2.HealthCheckResponse.SERVING


def test_a_plaintext_server_is_not_reached_by_a_tls_client(role_certs):
    service = ServerThread(make_settings("memory"))
    try:
        tls_client = client(service, role_certs, "gateway")
        with tls_client, pytest.raises(CacheUnavailable):
            tls_client.exists([new_key()])
    finally:
        service.close()


def test_tls_settings_must_be_complete(role_certs):
    with pytest.raises(SettingsError, match="tls_ca_file, tls_key_file"):
        make_settings("memory", tls_cert_file=str(role_certs.roles["cache"].cert))


def test_policy_names_every_rpc_of_the_services():
    """Every method of the three services has a rule (a new RPC must be given one)."""
    from embedding_cache_svc.proto import cache_pb2
    from encoder_svc.proto import encoder_pb2
    from llm_svc.proto import llm_pb2

    methods = {
        f"/{service.full_name}/{method.name}"
        for module in (cache_pb2, encoder_pb2, llm_pb2)
        for service in module.DESCRIPTOR.services_by_name.values()
        for method in service.methods
    }
    assert methods == set(POLICY)
    assert allowed("/grpc.health.v1.Health/Check", None)
    assert not allowed("/iris.cache.EmbeddingCache/Nonexistent", "admin")


def test_a_certificate_naming_two_roles_has_none():
    assert role_from_sans(["urn:iris:role:gateway", "urn:iris:role:encoder"]) is None
    assert role_from_sans(["urn:iris:role:root"]) is None
    assert role_from_sans(["https://example.com", "urn:iris:role:llm"]) == "llm"
