"""Image decode and fetch edges: an animated image counts by its canvas and only its first
frame is decoded; PIL's own bomb check stays on at the policy's limit; a remote address
must be globally routable per the IANA special-purpose registries (fec0::/10 and
192.88.99.0/24 included); an invalid host or IDNA label is a 400; the fetch ignores proxy
variables. Real PIL, a real HTTP server on loopback and a real socket as the "proxy"."""

from __future__ import annotations

import asyncio
import io
import ipaddress
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from PIL import Image

from gateway.errors import APIError
from gateway.intake.remote import RemoteImageFetcher, address_is_public
from iris.multimodal import DecodePolicy, ImageDecodeError, read_image_header
from iris.multimodal.decode import decode_image


def animated_gif(size=(64, 48), colours=("red", "blue", "green")) -> bytes:
    frames = [Image.new("RGB", size, colour) for colour in colours]
    buffer = io.BytesIO()
    frames[0].save(buffer, "GIF", save_all=True, append_images=frames[1:], duration=50)
    return buffer.getvalue()


def test_an_animation_counts_by_its_canvas_and_decodes_its_first_frame():
    data = animated_gif()
    header = read_image_header(data)
    assert (header.width, header.height) == (64, 48)
    rgb = decode_image(data)
    assert rgb.size == (64, 48) and rgb.getpixel((5, 5)) == (255, 0, 0)  # the first frame
    with pytest.raises(ImageDecodeError, match="3072 pixels, over the limit of 3000"):
        read_image_header(data, DecodePolicy(max_pixels=3000))


def test_pils_bomb_check_stays_on_at_the_policys_limit():
    DecodePolicy(max_pixels=40_000_000)
    assert Image.MAX_IMAGE_PIXELS == 40_000_000  # the largest policy made: the gateway's
    bomb = io.BytesIO()
    Image.new("1", (10_000, 9_000)).save(bomb, "PNG")  # 90 M pixels, past twice the limit
    with pytest.raises(ImageDecodeError, match="90000000 pixels, over the limit of 40000000"):
        read_image_header(bomb.getvalue(), DecodePolicy())


@pytest.mark.parametrize(
    "address",
    ["192.88.99.1", "fec0::1", "100.64.0.1", "198.18.0.1", "192.0.0.8", "2001:db8::1", "::1"],
)
def test_special_purpose_addresses_are_refused(address):
    assert not address_is_public(ipaddress.ip_address(address))
    fetcher = RemoteImageFetcher(enabled=True, allow_list=[address], max_bytes=1000, timeout_s=5)
    host = f"[{address}]" if ":" in address else address
    with pytest.raises(APIError, match="non-public address") as caught:
        asyncio.run(fetcher.fetch(f"http://{host}/a.png", "messages[0].content[0]"))
    assert caught.value.status == 400


def test_public_addresses_pass():
    for address in ("8.8.8.8", "2606:4700:4700::1111"):
        assert address_is_public(ipaddress.ip_address(address))


@pytest.mark.parametrize(
    "host", ["xn--a.example", "a..example", "x" * 64 + ".example", "b\u00e4d\u200d.example"]
)
def test_an_invalid_host_is_a_400(host):
    fetcher = RemoteImageFetcher(
        enabled=True, allow_list=["*.example"], max_bytes=1000, timeout_s=5
    )
    with pytest.raises(APIError) as caught:
        asyncio.run(fetcher.fetch(f"http://{host}/a.png", "p"))
    assert caught.value.status == 400
    assert "0x" not in caught.value.message


def test_the_fetch_ignores_proxy_variables(monkeypatch):
    png = io.BytesIO()
    Image.new("RGB", (4, 4), "red").save(png, "PNG")

    class Images(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802
            self.send_response(200)
            self.send_header("Content-Type", "image/png")
            self.send_header("Content-Length", str(len(png.getvalue())))
            self.end_headers()
            self.wfile.write(png.getvalue())

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Images)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    proxy = socket.socket()
    proxy.bind(("127.0.0.1", 0))
    proxy.listen()
    proxy.setblocking(False)
    for name in ("HTTP_PROXY", "http_proxy", "ALL_PROXY", "HTTPS_PROXY"):
        monkeypatch.setenv(name, f"http://127.0.0.1:{proxy.getsockname()[1]}")
    monkeypatch.delenv("NO_PROXY", raising=False)
    monkeypatch.delenv("no_proxy", raising=False)
    try:
        fetcher = RemoteImageFetcher(
            enabled=True,
            allow_list=["127.0.0.1"],
            max_bytes=10_000,
            timeout_s=10,
            address_allowed=lambda _: True,  # loopback is this test's "public" server
        )
        url = f"http://127.0.0.1:{server.server_address[1]}/a.png"
        assert asyncio.run(fetcher.fetch(url, "p")) == png.getvalue()
        with pytest.raises(BlockingIOError):
            proxy.accept()  # nobody connected to the proxy
    finally:
        server.shutdown()
        proxy.close()
