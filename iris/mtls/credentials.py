"""grpc credentials from a service's TLS settings (PEM files read once, at start).

Every role uses one certificate both ways: as its server certificate where it serves, and
as its client certificate where it calls a peer. Clients check the server's certificate
against the CA and against the DNS name of the role they expect (roles.role_hostname).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import grpc

from iris.mtls.roles import role_hostname


class TLSConfigError(ValueError):
    """TLS settings that are incomplete or name unreadable files."""


@dataclass(frozen=True)
class TLSFiles:
    """PEM paths: this service's certificate and key, and the CA that signs every role.
    All three or none (plaintext)."""

    cert_file: str | None = None
    key_file: str | None = None
    ca_file: str | None = None

    def __post_init__(self) -> None:
        given = [name for name in ("cert_file", "key_file", "ca_file") if getattr(self, name)]
        if given and len(given) != 3:
            missing = sorted({"cert_file", "key_file", "ca_file"} - set(given))
            raise TLSConfigError(
                f"mutual TLS needs tls_cert_file, tls_key_file and tls_ca_file; "
                f"missing: {', '.join('tls_' + name for name in missing)}"
            )

    @classmethod
    def of(cls, settings) -> TLSFiles:
        """From a settings object with tls_cert_file / tls_key_file / tls_ca_file."""
        return cls(settings.tls_cert_file, settings.tls_key_file, settings.tls_ca_file)

    @property
    def enabled(self) -> bool:
        return bool(self.cert_file)

    def _read(self) -> tuple[bytes, bytes, bytes]:
        out = []
        for name in ("cert_file", "key_file", "ca_file"):
            path = getattr(self, name)
            try:
                out.append(Path(path).read_bytes())
            except OSError as err:
                raise TLSConfigError(f"tls_{name} {path!r} cannot be read: {err}") from None
        return out[0], out[1], out[2]

    def server_credentials(self) -> grpc.ServerCredentials:
        """Server side: present our certificate, require and verify the client's."""
        cert, key, ca = self._read()
        return grpc.ssl_server_credentials(
            [(key, cert)], root_certificates=ca, require_client_auth=True
        )

    def channel_credentials(self) -> grpc.ChannelCredentials:
        cert, key, ca = self._read()
        return grpc.ssl_channel_credentials(
            root_certificates=ca, private_key=key, certificate_chain=cert
        )


def _secure_options(options: list, server_role: str) -> list:
    # Check the server's role name, not the dialled address (see roles.py).
    return [*options, ("grpc.ssl_target_name_override", role_hostname(server_role))]


def aio_channel(
    address: str, tls: TLSFiles | None, server_role: str, options: list | None = None
) -> grpc.aio.Channel:
    """An asyncio channel to a peer of `server_role`: mutual TLS when `tls` is enabled,
    else plaintext."""
    options = list(options or [])
    if tls is None or not tls.enabled:
        return grpc.aio.insecure_channel(address, options=options)
    return grpc.aio.secure_channel(
        address, tls.channel_credentials(), options=_secure_options(options, server_role)
    )


def sync_channel(
    address: str, tls: TLSFiles | None, server_role: str, options: list | None = None
) -> grpc.Channel:
    """The blocking twin of `aio_channel`."""
    options = list(options or [])
    if tls is None or not tls.enabled:
        return grpc.insecure_channel(address, options=options)
    return grpc.secure_channel(
        address, tls.channel_credentials(), options=_secure_options(options, server_role)
    )


def add_port(server, address: str, tls: TLSFiles | None) -> int:
    """Bind `address` on a grpc (aio) server, over mutual TLS when `tls` is enabled."""
    if tls is None or not tls.enabled:
        return server.add_insecure_port(address)
    return server.add_secure_port(address, tls.server_credentials())
