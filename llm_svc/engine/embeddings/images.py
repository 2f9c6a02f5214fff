"""Offline prompts with images: expand each placeholder to the image's tokens, key the image
by identity, fill its span with sentinels — what the gateway does for served requests."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from PIL import Image

from iris.models import ModelAdapter
from iris.multimodal import (
    ImageDecodeError,
    Modality,
    MultimodalItem,
    decode_image,
    image_identity,
    pad_with_offsets,
)
from llm_svc.engine.errors import InvalidRequestError


def load_image(image: Any, fingerprint: bytes, where: str = "image") -> tuple[Image.Image, bytes]:
    """(RGB image with EXIF applied, identity) of encoded bytes or a PIL image; bytes that
    the decode policy refuses are an InvalidRequestError naming `where`."""
    if isinstance(image, (bytes, bytearray, memoryview)):
        data = bytes(image)
        try:
            return decode_image(data), image_identity(data, fingerprint)
        except ImageDecodeError as err:
            raise InvalidRequestError(where, f"<{len(data)} bytes>", str(err)) from None
    if isinstance(image, Image.Image):
        rgb = image.convert("RGB")
        # A decoded image has no file bytes: key it by its size and pixels instead.
        pixels = f"{rgb.width}x{rgb.height}:".encode() + rgb.tobytes()
        return rgb, image_identity(pixels, fingerprint)
    raise InvalidRequestError(where, type(image).__name__, "must be bytes or a PIL image")


def image_prompt(
    adapter: ModelAdapter, token_ids: Sequence[int], images: Sequence[Any], fingerprint: bytes
) -> tuple[list[int], list[MultimodalItem], list[Image.Image]]:
    """(padded ids, items, decoded images) for a prompt whose image placeholders (one per
    image, in order) are in `token_ids`."""
    decoded, items, grids = [], [], []
    for index, image in enumerate(images):
        rgb, identity = load_image(image, fingerprint, f"images[{index}]")
        count, grid = adapter.image_token_count(rgb.width, rgb.height)
        item = MultimodalItem(Modality.IMAGE, token_count=count, grid=tuple(grid))
        item.set_identity(identity)
        decoded.append(rgb)
        items.append(item)
        grids.append(grid)
    try:
        expanded, spans = adapter.expand_prompt(list(token_ids), grids)
    except ValueError as err:
        raise InvalidRequestError("images", len(images), str(err)) from None
    for item, item_spans in zip(items, spans, strict=True):
        item.offsets = [tuple(span) for span in item_spans]
    return pad_with_offsets(expanded, items).tolist(), items, decoded
