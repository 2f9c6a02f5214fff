"""Remote image fetching: SSRF refusals, allow-list, size limit, no redirects, a
Content-Type check, no decompression, one deadline for the whole fetch, the request's
image budget."""

import gzip
import ipaddress
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from gateway.errors import APIError
from gateway.intake.budget import ImageBudget
from gateway.intake.remote import RemoteImageFetcher, address_is_public, host_allowed


@pytest.mark.parametrize(
    "address",
    [
        "127.0.0.1",
        "10.1.2.3",
        "172.16.0.1",
        "192.168.1.1",
        "169.254.169.254",  # cloud metadata
        "100.64.0.1",  # carrier-grade NAT
        "0.0.0.0",
        "224.0.0.1",
        "::1",
        "fe80::1",
        "fc00::1",
        "::ffff:127.0.0.1",
        "::ffff:10.0.0.1",
        "2002:a00:1::1",  # 6to4 (to 10.0.0.1)
        "2002:808:808::1",  # 6to4, even to a public IPv4: the relay is not ours to trust
        "2001:0:4136:e378:8000:63bf:3fff:fdd2",  # Teredo
        "64:ff9b::a00:1",  # NAT64 well-known prefix (to 10.0.0.1)
        "64:ff9b:1::808:808",  # NAT64 local-use prefix
    ],
)
def test_internal_addresses_are_not_public(address):
    assert not address_is_public(ipaddress.ip_address(address))


@pytest.mark.parametrize("address", ["8.8.8.8", "1.1.1.1", "2606:4700:4700::1111"])
def test_global_addresses_are_public(address):
    assert address_is_public(ipaddress.ip_address(address))


def test_allow_list_matches_exact_hosts_and_wildcard_subdomains():
    allow = ["images.example.com", "*.cdn.example.org"]
    assert host_allowed("images.example.com", allow)
    assert host_allowed("IMAGES.example.com.", allow)
    assert host_allowed("a.cdn.example.org", allow)
    assert not host_allowed("cdn.example.org", allow)
    assert not host_allowed("evil-images.example.com", allow)
    assert not host_allowed("images.example.com.evil.net", allow)


def fetcher(**overrides) -> RemoteImageFetcher:
    options = dict(enabled=True, allow_list=["*"], max_bytes=1000, timeout_s=2)
    options.update(overrides)
    return RemoteImageFetcher(**options)


@pytest.mark.parametrize(
    ("url", "allow", "fragment"),
    [
        ("http://127.0.0.1/x.png", ["127.0.0.1"], "non-public"),
        ("http://[::1]/x.png", ["::1"], "non-public"),
        ("http://169.254.169.254/latest/meta-data", ["169.254.169.254"], "non-public"),
        ("http://localhost/x.png", ["localhost"], "non-public"),
        ("http://10.0.0.8:8080/x.png", ["10.0.0.8"], "non-public"),
        ("http://example.com/x.png", ["images.example.com"], "allow-list"),
        ("gopher://example.com/x", ["example.com"], "http(s)"),
        ("http://example.com:99999/a.png", ["example.com"], "malformed"),
        ("http://example.com:abc/", ["example.com"], "malformed"),
        ("https://example.com:-1/", ["example.com"], "malformed"),
        ("http://[::1/a.png", ["*"], "malformed"),
    ],
)
async def test_ssrf_targets_are_refused_before_any_connection(url, allow, fragment):
    with pytest.raises(APIError) as caught:
        await fetcher(allow_list=allow).fetch(url, "p")
    assert caught.value.status == 400
    assert fragment in caught.value.message


async def test_disabled_remote_images_are_refused():
    with pytest.raises(APIError, match="disabled"):
        await fetcher(enabled=False).fetch("https://example.com/x.png", "p")


TRICKLE_ENDS = threading.Event()


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_GET(self):
        if self.path == "/redirect":
            self.send_response(302)
            self.send_header("Location", "http://169.254.169.254/")
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        if self.path == "/trickle":  # a byte at a time, each well within any read timeout
            self.send_response(200)
            self.send_header("Content-Type", "image/png")
            self.send_header("Content-Length", "900")
            self.end_headers()
            for _ in range(900):
                if TRICKLE_ENDS.wait(0.05):
                    return
                self.wfile.write(b"x")
                self.wfile.flush()
            return
        body = b"x" * (5000 if self.path.startswith("/big") else 100)
        kind = "text/html" if self.path == "/page.html" else "image/png"
        self.send_response(200)
        self.send_header("Content-Type", kind)
        if self.path == "/bomb":  # 100 bytes on the wire, 5 MB once decompressed
            body = gzip.compress(b"\0" * 5_000_000)
            self.send_header("Content-Encoding", "gzip")
        if self.path == "/big-unsized":  # no Content-Length: the cap must hold while reading
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            for start in range(0, len(body), 500):
                piece = body[start : start + 500]
                self.wfile.write(f"{len(piece):x}\r\n".encode() + piece + b"\r\n")
            self.wfile.write(b"0\r\n\r\n")
            return
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def http_server():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"127.0.0.1:{server.server_address[1]}"
    TRICKLE_ENDS.set()
    server.shutdown()


def loopback_fetcher(**overrides) -> RemoteImageFetcher:
    # The only way to reach a test server: a looser address check than production's.
    return fetcher(allow_list=["127.0.0.1"], address_allowed=lambda address: True, **overrides)


async def test_fetch_reads_the_body_from_an_allowed_host(http_server):
    assert await loopback_fetcher().fetch(f"http://{http_server}/a.png", "p") == b"x" * 100


@pytest.mark.parametrize("path", ["/big", "/big-unsized"])
async def test_fetch_stops_at_the_byte_limit(http_server, path):
    with pytest.raises(APIError) as caught:
        await loopback_fetcher().fetch(f"http://{http_server}{path}", "p")
    assert caught.value.status == 413
    assert "1000" in caught.value.message


async def test_a_content_type_other_than_an_image_is_refused(http_server):
    with pytest.raises(APIError) as caught:
        await loopback_fetcher().fetch(f"http://{http_server}/page.html", "p")
    assert caught.value.status == 400
    assert "'text/html', not image/*" in caught.value.message


async def test_a_compressed_answer_is_refused_not_decompressed(http_server):
    with pytest.raises(APIError) as caught:
        await loopback_fetcher().fetch(f"http://{http_server}/bomb", "p")
    assert caught.value.status == 400
    assert "Content-Encoding 'gzip'" in caught.value.message


async def test_the_whole_fetch_has_one_deadline(http_server):
    """Every byte arrives well within a per-read timeout; the total deadline still ends
    the fetch (had the body been read to its end, fetch would have returned it)."""
    with pytest.raises(APIError) as caught:
        await loopback_fetcher(timeout_s=0.5).fetch(f"http://{http_server}/trickle", "p")
    assert caught.value.status == 400
    assert "not fetched within 0.5 s" in caught.value.message


async def test_fetches_are_charged_to_the_request_budget(http_server):
    budget = ImageBudget(max_bytes=150, max_pixels=10**9)
    url = f"http://{http_server}/a.png"
    assert len(await loopback_fetcher().fetch(url, "p", budget)) == 100
    with pytest.raises(APIError) as caught:
        await loopback_fetcher().fetch(url, "q", budget)
    assert caught.value.status == 413
    assert "per-request limit of 150" in caught.value.message


async def test_redirects_are_not_followed(http_server):
    with pytest.raises(APIError, match="HTTP 302"):
        await loopback_fetcher().fetch(f"http://{http_server}/redirect", "p")
