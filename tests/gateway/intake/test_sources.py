"""Image part URLs → bytes: data URLs, bare base64, limits, refused schemes."""

import base64

import pytest

from gateway.errors import APIError
from gateway.intake.remote import RemoteImageFetcher
from gateway.intake.sources import image_bytes

FETCHER = RemoteImageFetcher(enabled=False, allow_list=[], max_bytes=1000, timeout_s=1)


async def test_data_url_and_bare_base64_give_the_same_bytes():
    payload = bytes(range(256))
    text = base64.b64encode(payload).decode()
    assert await image_bytes(f"data:image/png;base64,{text}", FETCHER, 1000, "p") == payload
    assert await image_bytes(text, FETCHER, 1000, "p") == payload
    assert await image_bytes(text[:50] + "\n" + text[50:], FETCHER, 1000, "p") == payload


@pytest.mark.parametrize(
    ("url", "status", "fragment"),
    [
        ("data:image/png;base64,@@@@", 400, "base64"),
        ("data:image/png,rawdata", 400, "data:<mime>;base64"),
        ("data:text/plain;base64,aGk=", 400, "text/plain"),
        ("file:///etc/passwd", 400, "'file'"),
        ("ftp://example.com/x.png", 400, "'ftp'"),
        ("https://example.com/x.png", 400, "disabled"),
        ("data:image/png;base64," + "A" * 2000, 413, "limit of 1000"),
    ],
)
async def test_bad_sources_are_client_errors_naming_the_problem(url, status, fragment):
    with pytest.raises(APIError) as caught:
        await image_bytes(url, FETCHER, 1000, "messages[0].content[1]")
    assert caught.value.status == status
    assert fragment in caught.value.message
    assert caught.value.param == "messages[0].content[1]"


async def test_an_image_decoded_window_by_window_is_the_whole_decode(monkeypatch):
    """Decoded in windows (here 10 characters, so groups, whitespace and the padding fall
    across them), the bytes and the refusals are those of one strict decode of the whole."""
    from gateway.intake import sources

    monkeypatch.setattr(sources, "DECODE_WINDOW", 10)
    for payload in (bytes(range(256)), b"x", b"xy", b"xyz" * 33):
        text = base64.b64encode(payload).decode()
        spaced = " ".join(text[i : i + 7] for i in range(0, len(text), 7))
        for url in (text, f"data:image/png;base64,{text}", spaced, "\n" + spaced + "\n"):
            assert await image_bytes(url, FETCHER, 1000, "p") == payload
    padded_inside = base64.b64encode(b"x").decode() * 4  # 'eA==eA==...': padding mid-data
    for bad in (padded_inside, "eA=", "abcdefghijk@mnop"):
        with pytest.raises(APIError) as refused:
            await image_bytes(bad, FETCHER, 1000, "p")
        assert refused.value.status == 400 and "base64" in refused.value.message
