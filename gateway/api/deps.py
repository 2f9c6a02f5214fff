"""Dependencies declared once: the Gateway, and the caller the auth middleware admitted."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from gateway.auth import SCOPE_KEY, Caller
from gateway.service import Gateway


def get_gateway(request: Request) -> Gateway:
    return request.app.state.gateway


GatewayDep = Annotated[Gateway, Depends(get_gateway)]


def get_caller(request: Request) -> Caller:
    """Who sent the request (gateway/auth.py checked its key before the body was read)."""
    return request.scope[SCOPE_KEY]


CallerDep = Annotated[Caller, Depends(get_caller)]
