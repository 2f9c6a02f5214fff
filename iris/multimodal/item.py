"""The multimodal item and its sentinel pad values (docs/design/multimodal.md)."""

from __future__ import annotations

import enum
import hashlib
from dataclasses import dataclass, field
from typing import Any

IDENTITY_BYTES = 32
PAD_TAG = b"iris-mm-pad-v1"
PAD_BASE = 1_000_000
PAD_MASK = (1 << 62) - 1
NUM_PAD_VALUES = 4
MAX_HASH = (1 << 64) - 1


class Modality(enum.StrEnum):
    IMAGE = "image"
    VIDEO = "video"
    AUDIO = "audio"


def pad_values_for(key: bytes) -> tuple[int, ...]:
    """The four sentinels of an item keyed by `key` (its identity, or a caller's hash as 8
    big-endian bytes): ``PAD_BASE + (d[8i:8i+8] as big-endian & (2^62 - 1))``."""
    digest = hashlib.sha256(PAD_TAG + key).digest()
    return tuple(
        PAD_BASE + (int.from_bytes(digest[8 * i : 8 * i + 8], "big") & PAD_MASK)
        for i in range(NUM_PAD_VALUES)
    )


def hash_of_identity(identity: bytes) -> int:
    """The 64-bit hash of an identity: its first 8 bytes, big-endian, unsigned."""
    return int.from_bytes(identity[:8], "big")


@dataclass
class MultimodalItem:
    """One image (video and audio later) inside one request.

    `offsets` are inclusive (start, end) spans in the padded input_ids; `token_count` is the
    number of embedding rows the item contributes and equals the sum of its span lengths
    once offsets are set; `grid` is the adapter's layout of those tokens (Qwen2-VL: t, h, w).
    """

    modality: Modality
    identity: bytes | None = None
    hash: int | None = None
    pad_values: tuple[int, ...] = ()
    offsets: list[tuple[int, int]] = field(default_factory=list)
    token_count: int = 0
    grid: tuple[int, ...] = ()
    feature: Any = None
    precomputed_embedding: Any = None

    def set_identity(self, identity: bytes) -> None:
        """Set the 32-byte identity; derives `hash` and `pad_values` from it."""
        if not isinstance(identity, (bytes, bytearray)) or len(identity) != IDENTITY_BYTES:
            size = len(identity) if isinstance(identity, (bytes, bytearray)) else type(identity)
            raise ValueError(f"identity must be {IDENTITY_BYTES} bytes, got {size}")
        self.identity = bytes(identity)
        self.hash = hash_of_identity(self.identity)
        self.pad_values = pad_values_for(self.identity)

    def set_hash(self, value: int) -> None:
        """Adopt a caller's 64-bit hash (no identity): sentinels come from its 8 bytes."""
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_HASH:
            raise ValueError(f"hash must be an unsigned 64-bit int, got {value!r}")
        self.identity = None
        self.hash = value
        self.pad_values = pad_values_for(value.to_bytes(8, "big"))

    @property
    def key(self) -> bytes:
        """What the cache and encoder key this item by: the identity, else the hash bytes."""
        if self.identity is not None:
            return self.identity
        if self.hash is not None:
            return self.hash.to_bytes(8, "big")
        raise ValueError("item has neither identity nor hash")

    @property
    def span_token_count(self) -> int:
        return sum(end - start + 1 for start, end in self.offsets)

    def padding_sequence(self, length: int) -> list[int]:
        """`length` sentinels in rotation: v0 v1 v2 v3 v0 ... (never one repeated value)."""
        if not self.pad_values:
            raise ValueError("item has no pad values: call set_identity or set_hash first")
        if length < 0:
            raise ValueError(f"padding length must be >= 0, got {length}")
        values = self.pad_values
        return [values[i % len(values)] for i in range(length)]
