"""What all the images of one request may cost together: image bytes (inline or fetched)
and decoded pixels, beside each image's own limits. A request over either is a 413."""

from __future__ import annotations

from gateway.errors import APIError


class ImageBudget:
    """Running totals of one request's images; `charge_*` raises once a total is over."""

    def __init__(self, max_bytes: int, max_pixels: int) -> None:
        self.max_bytes = max_bytes
        self.max_pixels = max_pixels
        self.bytes = 0
        self.pixels = 0

    def charge_bytes(self, count: int, param: str) -> None:
        self.bytes += count
        if self.bytes > self.max_bytes:
            raise APIError(
                413,
                f"the request's images come to over {self.bytes} bytes, over the "
                f"per-request limit of {self.max_bytes}",
                param=param,
                code="images_too_large",
            )

    def charge_pixels(self, count: int, param: str) -> None:
        self.pixels += count
        if self.pixels > self.max_pixels:
            raise APIError(
                413,
                f"the request's images come to {self.pixels} pixels, over the "
                f"per-request limit of {self.max_pixels}",
                param=param,
                code="images_too_large",
            )
