"""Triton kernels with torch twins: embedding scatter and scatter-add (with their host-side
row plan), checksum, paged attention (decode and extend), the grouped expert GEMM of the
fused MoE.

Each kernel picks Triton for CUDA tensors and its torch twin otherwise; `backend="triton"`
or `backend="torch"` forces one, and `CALLS[(name, backend)]` counts the launches. The
attention kernels are Triton only: their twin is the SDPA backend of llm_svc's engine,
and the engine's attention backend chooses between the two.
"""

from iris_kernels.backend import BACKENDS, CALLS, Backend, interpreting, resolve_backend
from iris_kernels.checksum import checksum
from iris_kernels.chunk_rows import ChunkRows, dest_rows_for_chunk
from iris_kernels.grouped_gemm import grouped_gemm
from iris_kernels.paged_attention_decode import paged_decode_attention
from iris_kernels.paged_attention_extend import paged_extend_attention
from iris_kernels.scatter import scatter_add_rows, scatter_rows

__all__ = [
    "BACKENDS",
    "CALLS",
    "Backend",
    "ChunkRows",
    "checksum",
    "dest_rows_for_chunk",
    "grouped_gemm",
    "interpreting",
    "paged_decode_attention",
    "paged_extend_attention",
    "resolve_backend",
    "scatter_add_rows",
    "scatter_rows",
]
