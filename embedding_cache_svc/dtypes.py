"""The tensor dtypes the cache stores, by wire name (TensorHeader.dtype), and their sizes.

The service only needs sizes; the client maps the same names onto torch dtypes.
"""

from __future__ import annotations

ITEM_SIZES: dict[str, int] = {
    "float32": 4,
    "float16": 2,
    "bfloat16": 2,
    "float64": 8,
    "float8_e4m3fn": 1,
    "float8_e5m2": 1,
}


def item_size(dtype: str) -> int:
    """Bytes per element of a supported dtype; ValueError naming the supported ones."""
    try:
        return ITEM_SIZES[dtype]
    except KeyError:
        supported = ", ".join(ITEM_SIZES)
        raise ValueError(f"unknown dtype {dtype!r}; supported: {supported}") from None
