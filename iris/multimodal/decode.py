"""The image decode policy: one set of rules for counting (header only) and encoding.

Formats allowed, a byte limit, a pixel limit checked from the header before any pixel is
decoded (decompression bombs are refused), and EXIF orientation applied, so the size read
from the header is the size after rotation. An animated image (GIF, WebP, APNG) counts by
its canvas, and only its first frame is ever decoded.
"""

from __future__ import annotations

import io
import re
import warnings
from dataclasses import dataclass, field

from PIL import Image, UnidentifiedImageError

DEFAULT_MAX_PIXELS = 40_000_000

# PIL's own decompression-bomb check stays on, at the policy's limit (raised to the largest
# policy a process makes: see DecodePolicy): it refuses in Image.open past twice the limit,
# before our header check, which refuses past the limit itself with the value and the limit.
# Between the two PIL only warns, and our check answers.
Image.MAX_IMAGE_PIXELS = DEFAULT_MAX_PIXELS
warnings.simplefilter("ignore", Image.DecompressionBombWarning)

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
    max_pixels: int = DEFAULT_MAX_PIXELS
    min_side: int = 1

    def __post_init__(self) -> None:
        # PIL's bomb check must not refuse what this policy allows.
        Image.MAX_IMAGE_PIXELS = max(Image.MAX_IMAGE_PIXELS or 0, self.max_pixels)


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
    except Image.DecompressionBombError as err:
        # PIL's message holds the image's size: "Image size (N pixels) exceeds ...".
        found = re.search(r"\((\d+) pixels\)", str(err))
        pixels = found.group(1) if found else f"more than {2 * policy.max_pixels}"
        raise ImageDecodeError(
            f"image has {pixels} pixels, over the limit of {policy.max_pixels}"
        ) from None
    except (UnidentifiedImageError, OSError, ValueError, SyntaxError):
        # PIL's message names the stream object (`<_io.BytesIO object at 0x…>`): not sent.
        raise ImageDecodeError("cannot identify image: not a supported image file") from None
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
        image.load()  # the first frame only: an animation's other frames are never decoded
        rgb = image.convert("RGB")
        if header.orientation in _TRANSPOSE:
            rgb = rgb.transpose(_TRANSPOSE[header.orientation])
    except Image.DecompressionBombError:
        raise ImageDecodeError(f"image is over the limit of {policy.max_pixels} pixels") from None
    except (OSError, ValueError, SyntaxError) as err:
        raise ImageDecodeError(f"image data is corrupt: {_clean(err)}") from None
    if rgb.size != (header.width, header.height):
        raise ImageDecodeError(
            f"decoded size {rgb.size[0]}x{rgb.size[1]} differs from header "
            f"{header.width}x{header.height}"
        )
    return rgb


def _clean(err: Exception) -> str:
    """An exception's text without object reprs (`<... at 0x…>`), cut short."""
    text = str(err)
    if " at 0x" in text:
        return type(err).__name__
    return text[:200]
