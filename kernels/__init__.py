"""Triton kernels with torch twins: embedding scatter, placeholder mask, tensor checksum.

Each kernel picks Triton for CUDA tensors and its torch twin otherwise; `backend="triton"`
or `backend="torch"` forces one, and `CALLS[(name, backend)]` counts the launches.
"""

from kernels.backend import BACKENDS, CALLS, Backend, interpreting, resolve_backend
from kernels.checksum import checksum
from kernels.chunk_rows import ChunkRows, dest_rows_for_chunk
from kernels.masked_scatter import masked_scatter_rows
from kernels.placeholder import placeholder_mask
from kernels.scatter import scatter_rows

__all__ = [
    "BACKENDS",
    "CALLS",
    "Backend",
    "ChunkRows",
    "checksum",
    "dest_rows_for_chunk",
    "interpreting",
    "masked_scatter_rows",
    "placeholder_mask",
    "resolve_backend",
    "scatter_rows",
]
