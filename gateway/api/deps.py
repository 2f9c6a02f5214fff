"""Dependencies declared once: the Gateway, and the API key check."""

from __future__ import annotations

import hmac
from typing import Annotated

from fastapi import Depends, Request

from gateway.errors import APIError
from gateway.service import Gateway


def get_gateway(request: Request) -> Gateway:
    return request.app.state.gateway


GatewayDep = Annotated[Gateway, Depends(get_gateway)]


def require_api_key(request: Request, gateway: GatewayDep) -> None:
    """With API keys configured, `Authorization: Bearer <key>` must carry one (else 401)."""
    keys = gateway.settings.api_keys
    if not keys:
        return
    header = request.headers.get("authorization", "")
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token:
        raise APIError(
            401, "missing API key: send Authorization: Bearer <key>", code="invalid_api_key"
        )
    # Compare against every key in constant time so timing reveals nothing.
    if not any(hmac.compare_digest(token.strip().encode(), key.encode()) for key in keys):
        raise APIError(401, "invalid API key", code="invalid_api_key")


Authorized = Depends(require_api_key)
