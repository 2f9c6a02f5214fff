"""The compiled Triton kernels on a CUDA device (skipped without one)."""

import pytest
import torch

from iris_kernels import checksum, scatter_add_rows, scatter_rows

pytestmark = pytest.mark.gpu

DTYPES = (torch.bfloat16, torch.float16, torch.float32)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("n", "d", "m"), [(1, 1, 1), (300, 4095, 129), (4096, 4096, 2048)])
def test_scatter_rows(compiled_triton, runs_on, dtype, n, d, m):
    device = compiled_triton
    dest = torch.randn(n, d, device=device).to(dtype)
    src = torch.randn(m, d, device=device).to(dtype)
    rows = torch.randperm(n)[:m]  # host rows: checked on the host, no sync
    with runs_on("scatter_rows", "triton"):
        got = scatter_rows(dest.clone(), src, rows)
    assert torch.equal(got, dest.clone().index_copy_(0, rows.to(device), src))
    with pytest.raises(ValueError, match="outside"):
        scatter_rows(dest, src[:1], [n])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("n", "d", "m"), [(1, 1, 1), (300, 4095, 129), (4096, 4096, 2048)])
def test_scatter_add_rows(compiled_triton, runs_on, dtype, n, d, m):
    device = compiled_triton
    dest = torch.randn(n, d, device=device).to(dtype)
    wide = torch.randn(m, 3 * d, device=device).to(dtype)
    src = wide[:, d : 2 * d]  # a deepstack level: a column slice of the entry's wide rows
    rows = torch.randperm(n)[:m]
    with runs_on("scatter_add_rows", "triton"):
        got = scatter_add_rows(dest.clone(), src, rows)
    # Compiled, the kernel rounds its float32 sum to nearest even, as index_add_ does.
    assert torch.equal(got, dest.clone().index_add_(0, rows.to(device), src))


@pytest.mark.parametrize("n", [0, 3, 4 * 16384 + 2, 8 << 20])
def test_checksum_same_on_every_path(compiled_triton, n):
    data = torch.randint(0, 256, (n,), dtype=torch.uint8)
    on_gpu = data.to(compiled_triton)
    value = checksum(data)
    assert checksum(on_gpu) == value
    assert checksum(on_gpu, backend="torch") == value


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("head_dim", "group"), [(64, 1), (128, 4), (128, 8)])
def test_paged_attention_equals_sdpa(compiled_triton, dtype, head_dim, group):
    from tests.kernels.test_paged_attention import compare

    # Decodes from one position to past split-K's threshold, chunks of ragged lengths with
    # cached prefixes starting mid-page, in one step; 16-token pages.
    seqs = [(1, 1), (17, 1), (300, 1), (2000, 1), (130, 130), (600, 77), (45, 3)]
    compare(seqs, page_size=16, kv_heads=2, group=group, head_dim=head_dim, dtype=dtype,
            seed=head_dim + group, device=compiled_triton)  # fmt: skip


def test_paged_attention_step_has_no_host_sync(compiled_triton):
    from llm_svc.engine.attention.triton import TritonBackend
    from tests.kernels.test_paged_attention import make_step

    cache, meta, tokens, _ = make_step(
        [(40, 1), (300, 1), (70, 20)], 16, 40, 2, 64, torch.bfloat16, 0
    )
    device = compiled_triton
    cache.k, cache.v = cache.k.to(device), cache.v.to(device)
    meta.slot_mapping, meta.block_tables = (
        meta.slot_mapping.to(device),
        meta.block_tables.to(device),
    )
    q = torch.randn(tokens, 4, 64, device=device, dtype=torch.bfloat16)
    kv = torch.randn(tokens, 2, 64, device=device, dtype=torch.bfloat16)
    backend = TritonBackend(cache)
    backend.plan(meta)
    backend.forward(0, q, kv, kv)  # compiles the kernels before the check
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        backend.plan(meta)
        backend.forward(0, q, kv, kv)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    torch.cuda.synchronize()
