"""Authentication at the gateway's door: an ASGI middleware that checks the API key and
the key's own rate (gateway/key_limits.py) before anything reads the request body, so an
unauthenticated client costs no more than its headers.

Keys come from settings (`api_keys`); without any, the gateway is open (as `iris up` is on
loopback) and every caller is the anonymous one. A key is known downstream only by its id,
`key-` + the first 12 hex digits of its SHA-256: safe to log, stable across restarts, and
never the key itself. Probes and the API docs stay open (and take no body:
gateway/middleware.py); metrics are on their own port.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
from collections.abc import Sequence
from dataclasses import dataclass

from starlette.types import ASGIApp, Receive, Scope, Send

from gateway.errors import APIError
from gateway.key_limits import KeyLimits

log = logging.getLogger(__name__)

OPEN_PATHS = frozenset(
    {"/healthz", "/readyz", "/docs", "/docs/oauth2-redirect", "/redoc", "/openapi.json"}
)
SCOPE_KEY = "iris.caller"  # where the middleware leaves the Caller for the routes


def key_id(key: str) -> str:
    return "key-" + hashlib.sha256(key.encode()).hexdigest()[:12]


@dataclass(frozen=True)
class Caller:
    """Who sent a request: the id of its API key, or None where no keys are configured."""

    key_id: str | None


class KeyRing:
    """The configured keys; `identify` checks an Authorization header against them."""

    def __init__(self, keys: Sequence[str]) -> None:
        self._keys = [(key.encode(), key_id(key)) for key in keys]

    def identify(self, authorization: str) -> Caller:
        if not self._keys:
            return Caller(None)
        scheme, _, token = authorization.partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise APIError(
                401, "missing API key: send Authorization: Bearer <key>", code="invalid_api_key"
            )
        presented = token.strip().encode()
        found = None
        # Compare with every key in constant time, so timing tells nothing about any.
        for key, ident in self._keys:
            if hmac.compare_digest(presented, key):
                found = ident
        if found is None:
            raise APIError(401, "invalid API key", code="invalid_api_key")
        return Caller(found)


class Authenticate:
    """401 for a missing or wrong key and 429 for a key over its rate, both before the body
    is read; the Caller goes into the scope for the routes (gateway/api/deps.py)."""

    def __init__(self, app: ASGIApp, keys: KeyRing, limits: KeyLimits) -> None:
        self.app = app
        self.keys = keys
        self.limits = limits

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in OPEN_PATHS:
            await self.app(scope, receive, send)
            return
        authorization = ""
        for name, value in scope["headers"]:
            if name == b"authorization":
                authorization = value.decode("latin-1")
                break
        try:
            caller = self.keys.identify(authorization)
            self.limits.admit(caller.key_id)
        except APIError as err:
            client = scope.get("client") or ("?", 0)
            # Never the key, nor anything of the body: the status and who asked.
            log.info(
                "refused %s %r from %s: %d %s",
                scope["method"],
                scope["path"][:100],
                client[0],
                err.status,
                err.code,
            )
            await err.response()(scope, receive, send)
            return
        scope[SCOPE_KEY] = caller
        await self.app(scope, receive, send)
