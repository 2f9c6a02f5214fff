"""Fetching http(s) image URLs without becoming a proxy into the cluster (SSRF).

Only when enabled; the host must be on the allow-list; every address the name resolves to
must be public (private, loopback, link-local, multicast, reserved and unspecified ranges
are refused), and the connection goes to the address that was checked, so a second DNS
answer cannot swap in an internal one. Redirects are not followed; the body is read under
a byte limit and a timeout.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from collections.abc import Callable, Sequence
from urllib.parse import urlsplit, urlunsplit

import httpx

from gateway.errors import APIError, bad_request

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address


def address_is_public(address: IPAddress) -> bool:
    """True for a globally routable unicast address (what a remote image may live on)."""
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return not (
        address.is_private
        or address.is_loopback
        or address.is_link_local
        or address.is_multicast
        or address.is_reserved
        or address.is_unspecified
        or not address.is_global
    )


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

    async def fetch(self, url: str, param: str) -> bytes:
        """The body of `url`, or an APIError (400 refused/failed, 413 too large)."""
        if not self.enabled:
            raise bad_request("remote image URLs are disabled on this gateway", param)
        try:
            parts = urlsplit(url)
            port = parts.port  # raises on a port that is not a number in 0..65535
        except ValueError as err:
            raise bad_request(f"image URL {url[:100]!r} is malformed: {err}", param) from None
        host = parts.hostname
        if parts.scheme not in ("http", "https") or not host:
            raise bad_request(f"image URL {url[:100]!r} is not an http(s) URL", param)
        if not host_allowed(host, self.allow_list):
            raise bad_request(f"image host {host!r} is not on the allow-list", param)
        port = port or (443 if parts.scheme == "https" else 80)
        address = await self._resolve(host, port, param)
        if not self.address_allowed(address):
            raise bad_request(f"image host {host!r} resolves to a non-public address", param)
        return await self._download(parts, host, address, param)

    async def _resolve(self, host: str, port: int, param: str) -> IPAddress:
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
        except OSError as err:
            raise bad_request(f"image host {host!r} does not resolve: {err}", param) from None
        addresses = [ipaddress.ip_address(info[4][0].split("%")[0]) for info in infos]
        # One internal answer among public ones is enough to refuse the whole name.
        for address in addresses:
            if not self.address_allowed(address):
                raise bad_request(f"image host {host!r} resolves to a non-public address", param)
        return addresses[0]

    async def _download(self, parts, host: str, address: IPAddress, param: str) -> bytes:
        netloc = f"[{address}]" if address.version == 6 else str(address)
        if parts.port:
            netloc += f":{parts.port}"
        pinned = urlunsplit((parts.scheme, netloc, parts.path or "/", parts.query, ""))
        headers = {"Host": host if not parts.port else f"{host}:{parts.port}"}
        extensions = {"sni_hostname": host} if parts.scheme == "https" else {}
        body = bytearray()
        try:
            async with (
                httpx.AsyncClient(timeout=self.timeout_s, follow_redirects=False) as client,
                client.stream("GET", pinned, headers=headers, extensions=extensions) as response,
            ):
                if response.status_code != 200:
                    raise bad_request(
                        f"image URL answered HTTP {response.status_code}", param, "image_fetch"
                    )
                async for chunk in response.aiter_bytes():
                    body += chunk
                    if len(body) > self.max_bytes:
                        raise APIError(
                            413,
                            f"remote image is over the limit of {self.max_bytes} bytes",
                            param=param,
                        )
        except httpx.TimeoutException:
            raise bad_request(
                f"image URL timed out after {self.timeout_s} s", param, "image_fetch"
            ) from None
        except httpx.HTTPError as err:
            raise bad_request(f"image URL failed: {err}", param, "image_fetch") from None
        return bytes(body)
