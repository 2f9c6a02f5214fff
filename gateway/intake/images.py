"""One image's bytes → a MultimodalItem: header under the decode policy, the adapter's token
count and grid from the (EXIF-rotated) size, and the identity computed from the bytes."""

from __future__ import annotations

from gateway.errors import bad_request
from gateway.intake.budget import ImageBudget
from iris.multimodal import (
    DecodePolicy,
    ImageDecodeError,
    Modality,
    MultimodalItem,
    image_identity,
    read_image_header,
)


def describe_image(
    data: bytes,
    *,
    adapter,
    policy: DecodePolicy,
    fingerprint: bytes,
    salt: bytes | None,
    param: str,
    budget: ImageBudget | None = None,
) -> MultimodalItem:
    """The item for one image (offsets are set later, once the prompt is expanded).

    Its identity is always computed here from the bytes, the fingerprint and the request's
    image salt (docs/design/multimodal.md), never taken from the caller. A policy refusal is a 400
    naming the value and the limit; the image's decoded pixels are charged to the
    request's `budget` (413 when over).
    """
    try:
        header = read_image_header(data, policy)
    except ImageDecodeError as err:
        raise bad_request(f"{param}: {err}", param, "invalid_image") from None
    if budget is not None:
        budget.charge_pixels(header.width * header.height, param)
    try:
        token_count, grid = adapter.image_token_count(header.width, header.height)
    except ValueError as err:  # a size the model's processor refuses (e.g. aspect ratio)
        raise bad_request(f"{param}: {err}", param, "invalid_image") from None
    item = MultimodalItem(Modality.IMAGE, token_count=int(token_count), grid=tuple(grid))
    item.set_identity(image_identity(data, fingerprint, salt))
    return item
