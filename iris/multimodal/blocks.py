"""Chained block hashes over padded input_ids, shared by pods and gateway
(docs/design/gateway.md)."""

from __future__ import annotations

from collections.abc import Sequence

import blake3
import numpy as np

from iris.multimodal.identity import check_salt

BLOCK_HASH_BYTES = 16
PREFIX_TAG = b"iris-prefix-v1"


def root_hash(fingerprint: bytes, salt: bytes | None = None) -> bytes:
    """h_0: fingerprint[:16]; under a tenant salt (32 bytes), BLAKE3 keyed by the salt over
    b"iris-prefix-v1" ‖ fingerprint, cut to 16 bytes. Every block hash chains on h_0, so
    prefixes under different salts share no hash (and, on a pod, no radix namespace)."""
    check_salt(salt)
    if not salt:
        return bytes(fingerprint[:BLOCK_HASH_BYTES])
    return blake3.blake3(PREFIX_TAG + bytes(fingerprint), key=salt).digest()[:BLOCK_HASH_BYTES]


def next_block_hash(previous: bytes, block: Sequence[int] | np.ndarray) -> bytes:
    """h_k = BLAKE3(h_{k-1} ‖ block_k as little-endian int64)[:16]."""
    data = np.asarray(block, dtype="<i8").tobytes()
    return blake3.blake3(previous + data).digest()[:BLOCK_HASH_BYTES]


def block_hashes(
    fingerprint: bytes,
    input_ids: Sequence[int] | np.ndarray,
    block_size: int,
    salt: bytes | None = None,
) -> list[bytes]:
    """[h_1, ..., h_n] for the n full blocks of `input_ids` (a partial tail is not hashed),
    chained on the root of `salt`'s namespace (none: the shared one)."""
    if block_size <= 0:
        raise ValueError(f"block_size must be > 0, got {block_size}")
    ids = np.asarray(input_ids, dtype="<i8").reshape(-1)
    hashes = []
    previous = root_hash(fingerprint, salt)
    for index in range(len(ids) // block_size):
        previous = next_block_hash(previous, ids[index * block_size : (index + 1) * block_size])
        hashes.append(previous)
    return hashes
