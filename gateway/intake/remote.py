"""Fetching http(s) image URLs without becoming a proxy into the cluster (SSRF).

Only when enabled; the host must be on the allow-list; every address the name resolves to
must be public (private, loopback, link-local, multicast, reserved and unspecified ranges
are refused, and so are the IPv6 ranges that tunnel to IPv4 — 6to4, Teredo, NAT64 — whose
far end could be anything), and the connection goes to the address that was checked, so a
second DNS answer cannot swap in an internal one. Redirects are not followed. The answer
must be an `image/*` Content-Type sent without content encoding (nothing is decompressed
before the size cap applies); its body is read under the byte limit and the request's
image budget, and the whole fetch — resolving, connecting, reading — under one deadline.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from urllib.parse import urlsplit, urlunsplit

import httpx

from gateway.errors import APIError, bad_request
from gateway.intake.budget import ImageBudget

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

# IPv6 prefixes that carry traffic on to an IPv4 address: 6to4, Teredo, NAT64 (well-known
# and local-use). Always refused: a relay could deliver to an internal host.
TUNNELS = tuple(
    ipaddress.ip_network(prefix)
    for prefix in ("2002::/16", "2001::/32", "64:ff9b::/96", "64:ff9b:1::/48")
)
# Every block of the IANA IPv4 and IPv6 special-purpose address registries, refused whatever
# its "globally reachable" column says (the standard library misses some: 192.88.99.0/24,
# the 6to4 relay anycast, and fec0::/10, the deprecated site-local block), plus multicast.
SPECIAL_PURPOSE = tuple(
    ipaddress.ip_network(prefix)
    for prefix in (
        # IPv4 (RFC 6890 and its updates)
        "0.0.0.0/8", "10.0.0.0/8", "100.64.0.0/10", "127.0.0.0/8", "169.254.0.0/16",
        "172.16.0.0/12", "192.0.0.0/24", "192.0.2.0/24", "192.31.196.0/24", "192.52.193.0/24",
        "192.88.99.0/24", "192.168.0.0/16", "192.175.48.0/24", "198.18.0.0/15",
        "198.51.100.0/24", "203.0.113.0/24", "224.0.0.0/4", "240.0.0.0/4",
        "255.255.255.255/32",
        # IPv6
        "::/128", "::1/128", "::ffff:0:0/96", "64:ff9b::/96", "64:ff9b:1::/48", "100::/64",
        "2001::/23", "2001:db8::/32", "2002::/16", "2620:4f:8000::/48", "3fff::/20",
        "5f00::/16", "fc00::/7", "fe80::/10", "fec0::/10", "ff00::/8",
    )
)  # fmt: skip


def address_is_public(address: IPAddress) -> bool:
    """True for a globally routable unicast address (what a remote image may live on)."""
    if isinstance(address, ipaddress.IPv6Address):
        if address.ipv4_mapped is not None:
            address = address.ipv4_mapped
        elif any(address in tunnel for tunnel in TUNNELS):
            return False
    if any(address in block for block in SPECIAL_PURPOSE if block.version == address.version):
        return False
    return not (
        address.is_private
        or address.is_loopback
        or address.is_link_local
        or address.is_multicast
        or address.is_reserved
        or address.is_unspecified
        or not address.is_global
    )


def _checked_host(host: str, param: str, kind: str = "image") -> str:
    """The URL's host as an ASCII name or address literal; an invalid name (a bad IDNA
    label, an empty or over-long label, stray characters) is a 400, never a 500."""
    try:
        ipaddress.ip_address(host)
        return host
    except ValueError:
        pass
    try:
        ascii_host = host.encode("idna").decode("ascii")
    except (UnicodeError, ValueError):
        raise bad_request(f"{kind} host {host[:100]!r} is not a valid host name", param) from None
    labels = ascii_host.rstrip(".").split(".")
    if len(ascii_host) > 253 or not all(
        label and len(label) <= 63 and all(c.isalnum() or c in "-_" for c in label)
        for label in labels
    ):
        raise bad_request(f"{kind} host {host[:100]!r} is not a valid host name", param)
    return ascii_host


def host_allowed(host: str, allow_list: Sequence[str]) -> bool:
    """`example.com` matches itself; `*.example.com` matches its subdomains only."""
    host = host.lower().rstrip(".")
    for entry in allow_list:
        entry = entry.lower().rstrip(".")
        if entry.startswith("*."):
            if host.endswith(entry[1:]):
                return True
        elif host == entry:
            return True
    return False


class RemoteImageFetcher:
    """Downloads one image URL under the gateway's remote-image rules."""

    def __init__(
        self,
        *,
        enabled: bool,
        allow_list: Sequence[str],
        max_bytes: int,
        timeout_s: float,
        address_allowed: Callable[[IPAddress], bool] = address_is_public,
    ) -> None:
        self.enabled = enabled
        self.allow_list = list(allow_list)
        self.max_bytes = max_bytes
        self.timeout_s = timeout_s
        # Tests that serve images from loopback pass a looser check; production never does.
        self.address_allowed = address_allowed

    async def fetch(
        self,
        url: str,
        param: str,
        budget: ImageBudget | None = None,
        media: str = "image",
        max_bytes: int | None = None,
    ) -> bytes:
        """The body of `url`, or an APIError (400 refused/failed/timed out, 413 over
        `max_bytes` — the fetcher's image limit unless given — or the request's `budget`).
        `media`: the Content-Type's main type the answer must have ("image", or "video" for
        a video_url under the same rules); every message names it."""
        limit = self.max_bytes if max_bytes is None else max_bytes
        try:
            async with asyncio.timeout(self.timeout_s):
                return await self._fetch(url, param, budget, _Media(media, limit))
        except TimeoutError:
            raise bad_request(
                f"{media} URL not fetched within {self.timeout_s:g} s", param, f"{media}_fetch"
            ) from None

    async def _fetch(
        self, url: str, param: str, budget: ImageBudget | None, media: _Media
    ) -> bytes:
        kind = media.kind
        if not self.enabled:
            raise bad_request(f"remote {kind} URLs are disabled on this gateway", param)
        try:
            parts = urlsplit(url)
            port = parts.port  # raises on a port that is not a number in 0..65535
        except ValueError as err:
            raise bad_request(f"{kind} URL {url[:100]!r} is malformed: {err}", param) from None
        host = parts.hostname
        if parts.scheme not in ("http", "https") or not host:
            raise bad_request(f"{kind} URL {url[:100]!r} is not an http(s) URL", param)
        host = _checked_host(host, param, kind)
        if not host_allowed(host, self.allow_list):
            raise bad_request(f"{kind} host {host!r} is not on the allow-list", param)
        port = port or (443 if parts.scheme == "https" else 80)
        address = await self._resolve(host, port, param, kind)
        if not self.address_allowed(address):
            raise bad_request(f"{kind} host {host!r} resolves to a non-public address", param)
        return await self._download(parts, host, address, param, budget, media)

    async def _resolve(self, host: str, port: int, param: str, kind: str) -> IPAddress:
        try:
            literal = ipaddress.ip_address(host)
        except ValueError:
            literal = None
        if literal is not None:
            return literal
        try:
            infos = await asyncio.get_running_loop().getaddrinfo(
                host, port, type=socket.SOCK_STREAM
            )
        except (OSError, UnicodeError, ValueError):
            raise bad_request(f"{kind} host {host[:100]!r} does not resolve", param) from None
        addresses = [ipaddress.ip_address(info[4][0].split("%")[0]) for info in infos]
        # One internal answer among public ones is enough to refuse the whole name.
        for address in addresses:
            if not self.address_allowed(address):
                raise bad_request(f"{kind} host {host!r} resolves to a non-public address", param)
        return addresses[0]

    async def _download(
        self,
        parts,
        host: str,
        address: IPAddress,
        param: str,
        budget: ImageBudget | None,
        media: _Media,
    ) -> bytes:
        netloc = f"[{address}]" if address.version == 6 else str(address)
        if parts.port:
            netloc += f":{parts.port}"
        pinned = urlunsplit((parts.scheme, netloc, parts.path or "/", parts.query, ""))
        headers = {
            "Host": host if not parts.port else f"{host}:{parts.port}",
            "Accept": f"{media.kind}/*",
            "Accept-Encoding": "identity",
        }
        extensions = {"sni_hostname": host} if parts.scheme == "https" else {}
        body = bytearray()
        try:
            async with (
                # trust_env=False: proxy variables (HTTP_PROXY, ...) would send the pinned
                # request elsewhere, past the address check.
                httpx.AsyncClient(follow_redirects=False, trust_env=False) as client,
                client.stream("GET", pinned, headers=headers, extensions=extensions) as response,
            ):
                self._check_response(response, param, media)
                # Raw bytes: nothing is decompressed (identity was checked above).
                async for chunk in response.aiter_raw():
                    body += chunk
                    if budget is not None:
                        budget.charge_bytes(len(chunk), param)
                    if len(body) > media.max_bytes:
                        raise media.too_large(param)
        except httpx.HTTPError as err:
            raise bad_request(
                f"{media.kind} URL failed: {type(err).__name__}", param, f"{media.kind}_fetch"
            ) from None
        return bytes(body)

    def _check_response(self, response: httpx.Response, param: str, media: _Media) -> None:
        kind, code = media.kind, f"{media.kind}_fetch"
        if response.status_code != 200:
            raise bad_request(f"{kind} URL answered HTTP {response.status_code}", param, code)
        answered = response.headers.get("content-type", "").split(";")[0].strip().lower()
        if not answered.startswith(f"{kind}/"):
            raise bad_request(
                f"{kind} URL answered Content-Type {answered[:60]!r}, not {kind}/*", param, code
            )
        encoding = response.headers.get("content-encoding", "identity").strip().lower()
        if encoding not in ("", "identity"):
            raise bad_request(
                f"{kind} URL answered Content-Encoding {encoding[:30]!r}; only identity is "
                "accepted",
                param,
                code,
            )
        length = response.headers.get("content-length", "")
        if length.isdigit() and int(length) > media.max_bytes:
            raise media.too_large(param)


@dataclass(frozen=True)
class _Media:
    """What one fetch is for: "image" or "video" (named in every message) and its limit."""

    kind: str
    max_bytes: int

    def too_large(self, param: str) -> APIError:
        setting = "video_max_bytes" if self.kind == "video" else "max_image_bytes"
        return APIError(
            413,
            f"remote {self.kind} is over the limit of {self.max_bytes} bytes ({setting})",
            param=param,
            code=f"{self.kind}_too_large",
        )
