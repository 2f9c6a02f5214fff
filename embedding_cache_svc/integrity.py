"""The cache's own check of a stored entry, for ReportCorrupt (docs/design/cache.md).

A reader that finds an entry damaged cannot delete it (Delete is admin-only): it reports
it, and the cache decides. The check is the readers' own, recomputed here without torch:
the checksum of iris_kernels/checksum.py (its definition, with numpy) over the stored bytes,
and no NaN or infinity among the values (read from the bit patterns of each dtype).
"""

from __future__ import annotations

import numpy as np

MASK64 = (1 << 64) - 1
GOLDEN = 0x9E3779B97F4A7C15
LENGTH_TAG = 0x6972697363686B31  # b"irischk1"
KEY_COUNT = 16384

# Per dtype: (unsigned view, exponent mask). A value is NaN or infinite when all of its
# exponent bits are set (float8_e4m3fn has no infinity: only S.1111.111 is NaN).
_NONFINITE: dict[str, tuple[type, int]] = {
    "float32": (np.uint32, 0x7F800000),
    "float16": (np.uint16, 0x7C00),
    "bfloat16": (np.uint16, 0x7F80),
    "float64": (np.uint64, 0x7FF0000000000000),
    "float8_e5m2": (np.uint8, 0x7C),
    "float8_e4m3fn": (np.uint8, 0x7F),
}


def _fmix64(z: int) -> int:
    z &= MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
    return z ^ (z >> 31)


def _keys() -> np.ndarray:
    z = np.arange(1, KEY_COUNT + 1, dtype=np.uint64) * np.uint64(GOLDEN)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    z = (z ^ (z >> np.uint64(31))) | np.uint64(1)
    return z.view(np.int64)


_KEYS = _keys()


def checksum(data: bytes | bytearray | memoryview) -> int:
    """The unsigned 64-bit checksum of `data` (iris_kernels/checksum.py defines it)."""
    length = len(data)
    padded = bytes(data) + b"\0" * (-length % 4)
    words = np.frombuffer(padded, dtype="<i4")
    full = words.size // KEY_COUNT
    sums: list[int] = []
    if full:
        head = words[: full * KEY_COUNT].reshape(full, KEY_COUNT)
        sums = np.einsum("bp,p->b", head, _KEYS, dtype=np.int64).tolist()
    tail = words[full * KEY_COUNT :]
    if tail.size:
        sums.append(int(np.einsum("p,p->", tail, _KEYS[: tail.size], dtype=np.int64)))
    h = _fmix64(length ^ LENGTH_TAG)
    for block_sum in sums:
        h = _fmix64(h ^ (block_sum & MASK64))
    return h


def nonfinite(data: bytes | bytearray | memoryview, dtype: str) -> int:
    """How many values of `data` (of `dtype`) are NaN or infinite."""
    view, mask = _NONFINITE[dtype]
    values = np.frombuffer(data, dtype=view)
    exponent = view(mask)
    return int(np.count_nonzero((values & exponent) == exponent))


def finding(data: bytes | bytearray | memoryview, dtype: str, expected_checksum: int) -> str:
    """ "checksum" or "nonfinite" when the entry is damaged, else "intact"."""
    if checksum(data) != expected_checksum:
        return "checksum"
    if nonfinite(data, dtype):
        return "nonfinite"
    return "intact"
