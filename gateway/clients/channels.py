"""gRPC channel options shared by every client the gateway opens."""

from __future__ import annotations

import grpc

from iris.mtls import TLSFiles, aio_channel

# Encode requests carry whole image files (up to the decode policy's byte limit).
MAX_MESSAGE_BYTES = 64 * 1024 * 1024
CHANNEL_OPTIONS = [
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    ("grpc.keepalive_time_ms", 30_000),
    ("grpc.enable_retries", 0),  # the gateway decides where a retry goes
    # A restarted pod, encoder or cache is found again within 2 s (gRPC's default backoff
    # grows to 120 s, which would keep a peer that came back out of use for minutes).
    ("grpc.initial_reconnect_backoff_ms", 250),
    ("grpc.max_reconnect_backoff_ms", 2000),
]


def open_channel(address: str, tls: TLSFiles | None, server_role: str) -> grpc.aio.Channel:
    """A channel to a peer of `server_role`: mutual TLS under the gateway's certificate when
    `tls` is enabled, else plaintext (loopback, or a cluster where NetworkPolicy guards it)."""
    return aio_channel(address, tls, server_role, CHANNEL_OPTIONS)
