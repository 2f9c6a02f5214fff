"""Triton kernels with torch twins: embedding scatter (with its host-side row plan), checksum.

Each kernel picks Triton for CUDA tensors and its torch twin otherwise; `backend="triton"`
or `backend="torch"` forces one, and `CALLS[(name, backend)]` counts the launches.
"""

from kernels.backend import BACKENDS, CALLS, Backend, interpreting, resolve_backend
from kernels.checksum import checksum
from kernels.chunk_rows import ChunkRows, dest_rows_for_chunk
from kernels.scatter import scatter_rows

__all__ = [
    "BACKENDS",
    "CALLS",
    "Backend",
    "ChunkRows",
    "checksum",
    "dest_rows_for_chunk",
    "interpreting",
    "resolve_backend",
    "scatter_rows",
]
