"""Tensor <-> bytes for the cache wire format, with checksums (iris_kernels.checksum).

Imported lazily by the clients, so a caller that only reserves and waits (the gateway)
never imports torch through this package.
"""

from __future__ import annotations

import torch

import iris_kernels
from embedding_cache_svc.client.errors import CacheInvalidArgument
from embedding_cache_svc.dtypes import ITEM_SIZES

TORCH_DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "float64": torch.float64,
    "float8_e4m3fn": torch.float8_e4m3fn,
    "float8_e5m2": torch.float8_e5m2,
}
DTYPE_NAMES: dict[torch.dtype, str] = {value: key for key, value in TORCH_DTYPES.items()}
assert set(TORCH_DTYPES) == set(ITEM_SIZES), "dtypes.py and the torch map must agree"


def dtype_name(dtype: torch.dtype | str) -> str:
    """The wire name of a torch dtype (or a wire name, checked)."""
    name = dtype if isinstance(dtype, str) else DTYPE_NAMES.get(dtype)
    if name not in TORCH_DTYPES:
        raise CacheInvalidArgument(
            f"dtype {dtype} is not storable; supported: {', '.join(TORCH_DTYPES)}"
        )
    return name


def encode(tensor: torch.Tensor, token_count: int) -> tuple[str, int, int, memoryview]:
    """(dtype name, hidden, checksum, C-order bytes on the host) of an embedding.

    The checksum is taken where the tensor lives (GPU or CPU give the same value)."""
    if tensor.dim() != 2:
        raise CacheInvalidArgument(
            f"embedding must be 2-D [rows, hidden], got {tuple(tensor.shape)}"
        )
    rows, hidden = tensor.shape
    if rows != token_count or token_count <= 0:
        raise CacheInvalidArgument(f"embedding has {rows} rows, token_count is {token_count}")
    name = dtype_name(tensor.dtype)
    dense = tensor.detach().contiguous()
    checksum = iris_kernels.checksum(dense)
    host = dense.cpu().reshape(-1).view(torch.uint8)
    return name, hidden, checksum, memoryview(host.numpy())


def decode(buffer: bytearray, token_count: int, hidden: int, dtype: str) -> torch.Tensor:
    """A tensor over `buffer` without copying it (the bytearray stays owned by the tensor)."""
    flat = torch.frombuffer(buffer, dtype=torch.uint8)
    return flat.view(TORCH_DTYPES[dtype]).view(token_count, hidden)


def verify(tensor: torch.Tensor, expected: int) -> bool:
    return iris_kernels.checksum(tensor) == expected
