"""How an entry is laid out in one Redis string, so that a Lua script can read its kind
and token count with one GETRANGE and a reader can stream it with further GETRANGEs.

    0..3   magic b"IRE1"
    4      kind: 0 = embedding, 1 = failed
    5..7   zero
    8..11  token_count, uint32 little-endian (0 for a failure)
    12..15 length of the next part, uint32 little-endian
    16..   embedding: EntryHeader protobuf, then the raw tensor bytes
           failure (earlier versions only): the reason, UTF-8

Failures are no longer entries of this layout: each is the reason alone, under its own key
per (item key, token count) (redis_store.py).
"""

from __future__ import annotations

import struct

from embedding_cache_svc.entry import Header
from embedding_cache_svc.proto import cache_pb2

MAGIC = b"IRE1"
PREAMBLE = struct.Struct("<4sB3xII")
PREAMBLE_BYTES = PREAMBLE.size
KIND_EMBEDDING = 0
KIND_FAILED = 1


def pack_embedding_prefix(header: Header) -> bytes:
    """Preamble and header; the tensor bytes follow (appended separately, not copied)."""
    encoded = header.to_proto().SerializeToString()
    return PREAMBLE.pack(MAGIC, KIND_EMBEDDING, header.token_count, len(encoded)) + encoded


def token_count_bytes(token_count: int) -> bytes:
    """The 4 bytes the Lua script compares against offset 8 of a stored entry."""
    return struct.pack("<I", token_count)


class CorruptEntry(ValueError):
    """A stored value does not have the layout above."""


def unpack_prefix(head: bytes) -> tuple[int, int, int]:
    """(kind, token_count, part length) from the first PREAMBLE_BYTES of a value."""
    if len(head) < PREAMBLE_BYTES:
        raise CorruptEntry(f"value of {len(head)} bytes is shorter than the preamble")
    magic, kind, token_count, length = PREAMBLE.unpack_from(head)
    if magic != MAGIC or kind not in (KIND_EMBEDDING, KIND_FAILED):
        raise CorruptEntry("value does not start with the entry preamble")
    return kind, token_count, length


def parse_header(encoded: bytes) -> cache_pb2.EntryHeader:
    return cache_pb2.EntryHeader.FromString(encoded)
