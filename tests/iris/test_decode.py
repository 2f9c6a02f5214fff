"""The image decode policy: formats, byte and pixel limits, EXIF orientation."""

import io

import pytest
from PIL import Image

from iris.multimodal import DecodePolicy, ImageDecodeError, decode_image, read_image_header


def encode(image: Image.Image, fmt: str = "PNG", **kwargs) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format=fmt, **kwargs)
    return buffer.getvalue()


def jpeg_with_orientation(width: int, height: int, orientation: int) -> bytes:
    image = Image.new("RGB", (width, height), (200, 10, 10))
    exif = Image.Exif()
    exif[0x0112] = orientation
    return encode(image, "JPEG", exif=exif)


@pytest.mark.parametrize("fmt", ["PNG", "JPEG", "WEBP", "GIF", "BMP"])
def test_allowed_formats_read_and_decode(fmt):
    data = encode(Image.new("RGB", (31, 17), (1, 2, 3)), fmt)
    header = read_image_header(data)
    assert (header.format, header.width, header.height) == (fmt, 31, 17)
    decoded = decode_image(data)
    assert decoded.mode == "RGB" and decoded.size == (31, 17)


@pytest.mark.parametrize(
    "orientation, size", [(1, (40, 20)), (3, (40, 20)), (6, (20, 40)), (8, (20, 40)), (5, (20, 40))]
)
def test_exif_orientation_applied_to_header_and_pixels(orientation, size):
    data = jpeg_with_orientation(40, 20, orientation)
    header = read_image_header(data)
    assert (header.width, header.height) == size
    assert decode_image(data).size == size


def test_format_not_allowed_names_the_format():
    data = encode(Image.new("RGB", (8, 8)), "TIFF")
    with pytest.raises(ImageDecodeError, match="TIFF not allowed"):
        read_image_header(data)


def test_byte_limit_names_value_and_limit():
    data = encode(Image.effect_noise((64, 64), 50))
    with pytest.raises(ImageDecodeError, match=f"{len(data)} bytes, over the limit of 100"):
        read_image_header(data, DecodePolicy(max_bytes=100))


def test_decompression_bomb_refused_from_header():
    # 20000 x 20000 of one colour compresses to a few hundred KB: refused before decoding.
    data = encode(Image.new("1", (20000, 20000)))
    with pytest.raises(ImageDecodeError, match="400000000 pixels, over the limit of 40000000"):
        decode_image(data)


@pytest.mark.parametrize("data", [b"", b"not an image", b"\x89PNG\r\n\x1a\n" + b"\x00" * 20])
def test_garbage_refused(data):
    with pytest.raises(ImageDecodeError):
        read_image_header(data)


def test_truncated_body_refused_at_decode():
    data = encode(Image.effect_noise((64, 64), 50).convert("RGB"), "PNG")
    truncated = data[: len(data) // 2]
    read_image_header(truncated)  # the header is intact
    with pytest.raises(ImageDecodeError, match="corrupt"):
        decode_image(truncated)


@pytest.mark.parametrize("orientation", range(1, 9))
def test_pixels_match_pil_exif_transpose(orientation):
    from PIL import ImageOps

    source = Image.effect_noise((24, 10), 60).convert("RGB")
    exif = Image.Exif()
    exif[0x0112] = orientation
    for fmt in ("PNG", "JPEG"):
        data = encode(source, fmt, exif=exif)
        expected = ImageOps.exif_transpose(Image.open(io.BytesIO(data))).convert("RGB")
        decoded = decode_image(data)
        assert decoded.size == expected.size
        assert decoded.tobytes() == expected.tobytes()
        header = read_image_header(data)
        assert (header.width, header.height) == expected.size
