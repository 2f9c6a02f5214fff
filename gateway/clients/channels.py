"""gRPC channel options shared by every client the gateway opens."""

from __future__ import annotations

import grpc

# Encode requests carry whole image files (up to the decode policy's byte limit).
MAX_MESSAGE_BYTES = 64 * 1024 * 1024
CHANNEL_OPTIONS = [
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    ("grpc.keepalive_time_ms", 30_000),
    ("grpc.enable_retries", 0),  # the gateway decides where a retry goes
]


def open_channel(address: str) -> grpc.aio.Channel:
    """An insecure channel (inside the cluster; the mesh or NetworkPolicy guards it)."""
    return grpc.aio.insecure_channel(address, options=CHANNEL_OPTIONS)
