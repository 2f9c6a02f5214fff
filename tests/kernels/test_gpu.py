"""The compiled Triton kernels on a CUDA device (skipped without one)."""

import pytest
import torch

from kernels import checksum, scatter_rows

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


@pytest.mark.parametrize("n", [0, 3, 4 * 16384 + 2, 8 << 20])
def test_checksum_same_on_every_path(compiled_triton, n):
    data = torch.randint(0, 256, (n,), dtype=torch.uint8)
    on_gpu = data.to(compiled_triton)
    value = checksum(data)
    assert checksum(on_gpu) == value
    assert checksum(on_gpu, backend="torch") == value
