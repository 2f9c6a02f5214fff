"""Small helpers of the end-to-end tests: images, chat bodies, /metrics scraping."""

from __future__ import annotations

import base64
import io
import random


def image_png(seed: int, size: tuple[int, int] = (64, 48)) -> bytes:
    """A distinct picture per seed (random noise), PNG-encoded."""
    from PIL import Image

    rng = random.Random(seed)
    pixels = bytes(rng.randrange(256) for _ in range(size[0] * size[1] * 3))
    image = Image.frombytes("RGB", size, pixels)
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return buffer.getvalue()


def image_message(png: bytes, text: str = "Describe the image.") -> list[dict]:
    url = "data:image/png;base64," + base64.b64encode(png).decode()
    return [
        {
            "role": "user",
            "content": [
                {"type": "image_url", "image_url": {"url": url}},
                {"type": "text", "text": text},
            ],
        }
    ]


# What no client-visible error may contain (issue 20, item 6): gRPC status names and debug
# strings, besides every internal address.
GRPC_WORDS = ("StatusCode", "debug_error_string", "UNAVAILABLE", "DEADLINE_EXCEEDED", "ipv4:")


def internal_details_in(text: str, platform) -> list[str]:
    """The internal details (service addresses, ports, gRPC words) that `text` names."""
    found = [word for word in GRPC_WORDS if word in text]
    for service in platform.services:
        if service.kind == "gateway":
            continue
        host, _, port = service.address.rpartition(":")
        found += [part for part in (service.address, f":{port}") if part in text]
    return found
