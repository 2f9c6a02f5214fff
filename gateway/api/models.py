"""GET /v1/models and /v1/models/{id}: the one model this gateway serves."""

from __future__ import annotations

from fastapi import APIRouter

from gateway.api.deps import GatewayDep
from gateway.api.errors import ERROR_RESPONSES

router = APIRouter(tags=["models"])
_CREATED = 0  # served from a local directory: no meaningful creation time


def _model(gateway) -> dict:
    return {
        "id": gateway.model_name,
        "object": "model",
        "created": _CREATED,
        "owned_by": "iris",
        "max_model_len": gateway.max_model_len(),
    }


@router.get("/v1/models", responses=ERROR_RESPONSES)
async def list_models(gateway: GatewayDep) -> dict:
    """The served model."""
    return {"object": "list", "data": [_model(gateway)]}


@router.get("/v1/models/{model_id:path}", responses=ERROR_RESPONSES)
async def get_model(model_id: str, gateway: GatewayDep) -> dict:
    """The served model by id; any other id is a 404."""
    gateway.check_model(model_id)
    return _model(gateway)
