"""Roles, how a certificate carries one, and which role may call which RPC.

A role certificate carries two subject alternative names:

- the URI `urn:iris:role:<role>`, which servers read to authorise the caller, and
- the DNS name `<role>.iris.internal`, which clients check on the server: a client talking
  to the cache expects `cache.iris.internal` whatever address it dialled (pods found
  through EndpointSlices are dialled by IP, which no certificate could list in advance).

A method missing from `POLICY` is refused to everyone; gRPC health is open to any caller
that passes the TLS handshake (any certificate of the CA, whatever its role).
"""

from __future__ import annotations

ROLES: tuple[str, ...] = ("gateway", "encoder", "cache", "llm", "admin")

ROLE_URI_PREFIX = "urn:iris:role:"
ROLE_DNS_SUFFIX = ".iris.internal"


def role_uri(role: str) -> str:
    return ROLE_URI_PREFIX + role


def role_hostname(role: str) -> str:
    return role + ROLE_DNS_SUFFIX


_CACHE = "/iris.cache.EmbeddingCache/"
_ENCODER = "/iris.encoder.Encoder/"
_LLM = "/iris.llm.LLM/"

# Who may call what. `admin` is an operator's certificate for maintenance (Delete, Stats);
# no Iris service holds it.
POLICY: dict[str, frozenset[str]] = {
    # Only encoders store results (an embedding, or why an image failed).
    _CACHE + "Put": frozenset({"encoder"}),
    _CACHE + "Fail": frozenset({"encoder"}),
    # The gateway reserves the images it sends to encoders and abandons leases whose encode
    # never ran; an encoder reserves too: it takes over the lease on the work it accepted
    # (and extends it while it works), and abandons it when its Put fails.
    _CACHE + "Reserve": frozenset({"gateway", "encoder"}),
    _CACHE + "Abandon": frozenset({"gateway", "encoder"}),
    # Readers: the pods (assembly) and the gateway.
    _CACHE + "BatchGet": frozenset({"llm", "gateway"}),
    _CACHE + "Wait": frozenset({"llm", "gateway"}),
    _CACHE + "Exists": frozenset({"llm", "gateway", "encoder"}),
    _CACHE + "Delete": frozenset({"admin"}),
    # A reader that finds an entry damaged reports it; the cache checks it and decides.
    _CACHE + "ReportCorrupt": frozenset({"llm", "gateway"}),
    _CACHE + "Stats": frozenset({"gateway", "encoder", "llm", "admin"}),
    # Encoding and generation are asked for by gateways only.
    _ENCODER + "Encode": frozenset({"gateway"}),
    _LLM + "Generate": frozenset({"gateway"}),
    _LLM + "Abort": frozenset({"gateway"}),
    _LLM + "GetModelInfo": frozenset({"gateway", "admin"}),
    _LLM + "StreamKVEvents": frozenset({"gateway"}),
    _LLM + "GetKVSnapshot": frozenset({"gateway"}),
    _LLM + "GetLoad": frozenset({"gateway", "admin"}),
    # Maintenance: drop a pod's prefix cache (tests use its silent form, a test hook).
    _LLM + "ResetPrefixCache": frozenset({"admin"}),
}

OPEN_PREFIXES: tuple[str, ...] = ("/grpc.health.v1.Health/",)


def allowed(method: str, role: str | None) -> bool:
    """Whether a caller of `role` (None: no role in its certificate) may call `method`."""
    if method.startswith(OPEN_PREFIXES):
        return True
    return role is not None and role in POLICY.get(method, frozenset())


def role_from_sans(uris: list[str]) -> str | None:
    """The one role a certificate's URI SANs name (None if none, or several differ)."""
    found = {uri[len(ROLE_URI_PREFIX) :] for uri in uris if uri.startswith(ROLE_URI_PREFIX)}
    if len(found) != 1:
        return None
    (role,) = found
    return role if role in ROLES else None
