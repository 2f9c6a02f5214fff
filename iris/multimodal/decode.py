"""The image decode policy: one set of rules for counting (header only) and encoding.

Formats allowed, a byte limit, a pixel limit checked from the header before any pixel is
decoded (decompression bombs are refused), and EXIF orientation applied, so the size read
from the header is the size after rotation.
"""

from __future__ import annotations

import io
from dataclasses import dataclass, field

from PIL import Image, UnidentifiedImageError

# The pixel limit is the policy's, checked from the header before decoding; PIL's own global
# bomb check would refuse first with a message naming neither our limit nor our value.
Image.MAX_IMAGE_PIXELS = None

EXIF_ORIENTATION = 0x0112
# Orientations 5..8 rotate by 90 or 270 degrees: width and height swap.
_SWAPPING_ORIENTATIONS = {5, 6, 7, 8}


class ImageDecodeError(ValueError):
    """An image the policy refuses; the message names the value and the limit."""


@dataclass(frozen=True)
class DecodePolicy:
    formats: frozenset[str] = field(
        default_factory=lambda: frozenset({"JPEG", "PNG", "WEBP", "GIF", "BMP"})
    )
    max_bytes: int = 20 * 1024 * 1024
    max_pixels: int = 40_000_000
    min_side: int = 1


@dataclass(frozen=True)
class ImageHeader:
    format: str
    width: int  # after EXIF orientation
    height: int
    orientation: int = 1


def _open(data: bytes | memoryview, policy: DecodePolicy) -> Image.Image:
    if len(data) > policy.max_bytes:
        raise ImageDecodeError(f"image is {len(data)} bytes, over the limit of {policy.max_bytes}")
    if len(data) == 0:
        raise ImageDecodeError("image is empty (0 bytes)")
    try:
        image = Image.open(io.BytesIO(data))
    except (UnidentifiedImageError, OSError, ValueError) as err:
        raise ImageDecodeError(f"cannot identify image: {err}") from None
    if image.format not in policy.formats:
        allowed = ", ".join(sorted(policy.formats))
        raise ImageDecodeError(f"image format {image.format} not allowed (allowed: {allowed})")
    return image


def _orientation(image: Image.Image) -> int:
    try:
        if image.format == "PNG":
            # getexif() on a PNG decodes the whole image looking for a late eXIf chunk; the
            # header path must stay cheap, so only an eXIf chunk before the pixels counts.
            # decode_image applies the same orientation, so counts and pixels agree.
            raw = image.info.get("exif")
            if not raw:
                return 1
            exif = Image.Exif()
            exif.load(raw)
        else:
            exif = image.getexif()
        value = exif.get(EXIF_ORIENTATION, 1)
    except Exception:  # a corrupt EXIF block does not make the image unusable
        return 1
    return value if isinstance(value, int) and 1 <= value <= 8 else 1


# How to undo each EXIF orientation (the TIFF/EXIF definition of tag 0x0112).
_TRANSPOSE = {
    2: Image.Transpose.FLIP_LEFT_RIGHT,
    3: Image.Transpose.ROTATE_180,
    4: Image.Transpose.FLIP_TOP_BOTTOM,
    5: Image.Transpose.TRANSPOSE,
    6: Image.Transpose.ROTATE_270,
    7: Image.Transpose.TRANSVERSE,
    8: Image.Transpose.ROTATE_90,
}


def read_image_header(data: bytes | memoryview, policy: DecodePolicy | None = None) -> ImageHeader:
    """Format and (rotated) size from the header alone; no pixels are decoded."""
    policy = policy or DecodePolicy()
    image = _open(data, policy)
    width, height = image.size
    orientation = _orientation(image)
    if orientation in _SWAPPING_ORIENTATIONS:
        width, height = height, width
    if width < policy.min_side or height < policy.min_side:
        raise ImageDecodeError(f"image size {width}x{height} below {policy.min_side} pixel(s)")
    if width * height > policy.max_pixels:
        raise ImageDecodeError(
            f"image has {width}x{height} = {width * height} pixels, over the limit of "
            f"{policy.max_pixels}"
        )
    return ImageHeader(image.format, width, height, orientation)


def decode_image(data: bytes | memoryview, policy: DecodePolicy | None = None) -> Image.Image:
    """Decode to RGB with EXIF orientation applied, under the same checks as the header."""
    policy = policy or DecodePolicy()
    header = read_image_header(data, policy)
    image = _open(data, policy)
    try:
        image.load()
        rgb = image.convert("RGB")
        if header.orientation in _TRANSPOSE:
            rgb = rgb.transpose(_TRANSPOSE[header.orientation])
    except (OSError, ValueError, SyntaxError) as err:
        raise ImageDecodeError(f"image data is corrupt: {err}") from None
    if rgb.size != (header.width, header.height):
        raise ImageDecodeError(
            f"decoded size {rgb.size[0]}x{rgb.size[1]} differs from header "
            f"{header.width}x{header.height}"
        )
    return rgb
