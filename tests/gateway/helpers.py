"""Small helpers shared by the gateway tests: images and chat message bodies."""

from __future__ import annotations

import base64
import io
import time

from fastapi.testclient import TestClient
from PIL import Image

from gateway.app import create_app
from gateway.service import Gateway
from gateway.settings import GatewaySettings


def png_bytes(width: int = 64, height: int = 48, colour: str = "red") -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", (width, height), colour).save(buffer, "PNG")
    return buffer.getvalue()


def data_url(data: bytes, mime: str = "image/png") -> str:
    return f"data:{mime};base64," + base64.b64encode(data).decode()


def image_message(url: str, text: str = "What is in this image?") -> dict:
    return {
        "role": "user",
        "content": [
            {"type": "text", "text": text},
            {"type": "image_url", "image_url": {"url": url}},
        ],
    }


def make_client(parts, **overrides) -> TestClient:
    fields = {
        "model": str(parts["model_dir"]),
        "llm_addresses": [parts["pod_address"]],
        "encoder_addresses": [parts["encoder_address"]],
        "cache_address": parts["cache_address"],
        "load_poll_interval_s": 0.05,
        **overrides,
    }
    settings = GatewaySettings.load(**fields)
    return TestClient(create_app(settings, Gateway(settings, parts["adapter"])))


def wait_ready(client: TestClient) -> None:
    for _ in range(200):
        if client.get("/readyz").status_code == 200:
            return
        time.sleep(0.02)
    raise AssertionError("gateway never became ready")


def eventually(condition, timeout: float = 60.0) -> None:
    """Poll `condition` until it holds (a generous deadline: it returns as soon as it does)."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.02)
