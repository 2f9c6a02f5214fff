"""Which tenant a request belongs to, as the salts that keep tenants apart
(docs/design/security.md).

A salt is 32 bytes derived (BLAKE3 key derivation) from what names the tenant; the raw
string or API key never leaves the gateway. The gateway's `tenancy` setting decides
(unset: `per-key` whenever API keys are required, `shared` when the gateway is open):

- `shared`: a request's `cache_salt` (vLLM's field), if it sends one, is its
  tenant; requests without one share images and prefixes with each other.
- `per-key`: the request's API key (`Authorization: Bearer`) is its tenant; a `cache_salt`
  it adds splits that key's space further. The key goes into the derivation, so no client
  can choose another key's salt. A request with no key falls back to `shared`.

Images are salted with the tenant's salt, or, in the no-reuse benchmark mode, with a fresh
random salt per request (so no image work is shared, yet identities stay verifiable by the
encoder and text prefixes are reused as in the other modes).
"""

from __future__ import annotations

import enum
import os
from dataclasses import dataclass
from typing import Any

import blake3

from gateway.errors import bad_request
from iris.multimodal import SALT_BYTES, canonical_json

_FROM_CACHE_SALT = "iris 2026-12-01 tenant salt from cache_salt v1"
_FROM_API_KEY = "iris 2026-12-01 tenant salt from API key v1"


class Tenancy(enum.StrEnum):
    SHARED = "shared"
    PER_KEY = "per-key"


@dataclass(frozen=True)
class RequestSalts:
    """`prefix`: the KV prefix namespace (None: shared); `images`: mixed into every image
    identity of the request (None: unsalted)."""

    prefix: bytes | None = None
    images: bytes | None = None


NO_SALTS = RequestSalts()


def check_cache_salt(value: Any, max_chars: int) -> str | None:
    """The request's `cache_salt`: absent, or a non-empty string of at most `max_chars`
    characters; anything else is a 400 naming the field."""
    if value is None:
        return None
    if not isinstance(value, str):
        raise bad_request(f"cache_salt must be a string, got {type(value).__name__}", "cache_salt")
    if not value:
        raise bad_request("cache_salt must be a non-empty string when given", "cache_salt")
    if len(value) > max_chars:
        raise bad_request(
            f"cache_salt is {len(value)} characters, over the limit of {max_chars}", "cache_salt"
        )
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise bad_request("cache_salt is not valid Unicode", "cache_salt") from None
    return value


def bearer_key(authorization: str | None) -> str | None:
    """The key of an `Authorization: Bearer <key>` header, else None. (Whether the key is
    valid is the authentication's business; this only reads it.)"""
    scheme, _, token = (authorization or "").partition(" ")
    token = token.strip()
    return token if scheme.lower() == "bearer" and token else None


def tenant_salt(tenancy: Tenancy, cache_salt: str | None, api_key: str | None) -> bytes | None:
    """The tenant's 32-byte salt, or None for the shared namespace."""
    if tenancy is Tenancy.PER_KEY and api_key is not None:
        return _derive(_FROM_API_KEY, canonical_json([api_key, cache_salt]))
    if cache_salt is None:
        return None
    return _derive(_FROM_CACHE_SALT, cache_salt.encode("utf-8"))


def request_salts(tenant: bytes | None, embedding_reuse: bool) -> RequestSalts:
    """The request's salts: the tenant's for prefixes; for images the tenant's, or a fresh
    random one per request when embedding reuse is off."""
    images = tenant if embedding_reuse else os.urandom(SALT_BYTES)
    return RequestSalts(prefix=tenant, images=images)


def _derive(context: str, material: bytes) -> bytes:
    return blake3.blake3(material, derive_key_context=context).digest(length=SALT_BYTES)
