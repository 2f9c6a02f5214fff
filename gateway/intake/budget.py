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
        # A fetched image is charged chunk by chunk: its total is still growing when it
        # passes the limit, hence "over".
        self.bytes += count
        _check(f"over {self.bytes} bytes", self.bytes, self.max_bytes, param)

    def charge_pixels(self, count: int, param: str) -> None:
        self.pixels += count
        _check(f"{self.pixels} pixels", self.pixels, self.max_pixels, param)


def _check(amount: str, total: int, limit: int, param: str) -> None:
    if total > limit:
        raise APIError(
            413,
            f"the request's images come to {amount}, over the per-request limit of {limit}",
            param=param,
            code="images_too_large",
        )
