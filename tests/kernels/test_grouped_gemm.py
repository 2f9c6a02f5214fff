"""grouped_gemm: the Triton kernel (interpreted) against its twin and a per-row reference,
on ragged expert loads (empty experts, partial tiles, one expert owning every row)."""

import pytest
import torch

from iris_kernels import grouped_gemm
from iris_kernels.grouped_gemm import BLOCK_M, expert_tiles

# (counts per expert, N, K): empty experts first, last and between; a tile boundary crossed.
LOADS = [
    ([3, 0, 17, 1, 0], 24, 40),
    ([0, 0, 5], 16, 16),
    ([33, 0, 0, 0], 70, 130),  # one expert, three tiles; N and K past one block
    ([0, 1, 0, 2, 0, 0, 16, 0], 8, 8),
    ([0, 0], 16, 16),  # no rows at all
]


def reference(x, weight, counts, row_scale):
    """Row by row: row r belongs to the expert whose slice holds it."""
    owner = torch.repeat_interleave(torch.arange(len(counts)), torch.tensor(counts))
    out = torch.zeros(x.shape[0], weight.shape[1], dtype=torch.float64)
    for r, e in enumerate(owner.tolist()):
        out[r] = weight[e].double() @ x[r].double()
    if row_scale is not None:
        out = out * row_scale.double()[:, None]
    return out


@pytest.mark.parametrize(("counts", "n", "k"), LOADS)
@pytest.mark.parametrize("scaled", [False, True])
def test_triton_equals_twin_on_ragged_expert_loads(runs_on, counts, n, k, scaled):
    generator = torch.Generator().manual_seed(sum(counts) * 31 + n + k)
    rows = sum(counts)
    x = torch.randn(rows, k, generator=generator)
    weight = torch.randn(len(counts), n, k, generator=generator)
    row_scale = torch.rand(rows, generator=generator) if scaled else None
    count_tensor = torch.tensor(counts)
    with runs_on("grouped_gemm", "triton"):
        got = grouped_gemm(x, weight, count_tensor, row_scale, backend="triton")
    with runs_on("grouped_gemm", "torch"):
        twin = grouped_gemm(x, weight, count_tensor, row_scale, backend="torch")
    expected = reference(x, weight, counts, row_scale).float()
    assert got.shape == twin.shape == (rows, n)
    torch.testing.assert_close(twin, expected, rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(got, twin, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize(("counts", "n", "k"), [LOADS[0], LOADS[2]])
def test_column_major_experts_equal_row_major(runs_on, counts, n, k):
    """The CPU lays experts out column-major (llm_svc/engine/models/cpu_layout.py): the
    kernel reads the weight by its strides, so both layouts give the same product."""
    generator = torch.Generator().manual_seed(n * k)
    x = torch.randn(sum(counts), k, generator=generator)
    weight = torch.randn(len(counts), n, k, generator=generator)
    columns = weight.transpose(1, 2).contiguous().transpose(1, 2)
    assert columns.stride() == (n * k, 1, n)
    with runs_on("grouped_gemm", "triton"):
        got = grouped_gemm(x, columns, torch.tensor(counts), backend="triton")
    with runs_on("grouped_gemm", "torch"):
        twin = grouped_gemm(x, weight, torch.tensor(counts), backend="torch")
    torch.testing.assert_close(got, twin, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_triton_equals_twin_in_half_precision(runs_on, dtype):
    counts, n, k = LOADS[0]
    generator = torch.Generator().manual_seed(5)
    x = torch.randn(sum(counts), k, generator=generator).to(dtype)
    weight = torch.randn(len(counts), n, k, generator=generator).to(dtype)
    row_scale = torch.rand(sum(counts), generator=generator).to(dtype)
    got = grouped_gemm(x, weight, torch.tensor(counts), row_scale, backend="triton")
    twin = grouped_gemm(x, weight, torch.tensor(counts), row_scale, backend="torch")
    assert got.dtype == dtype
    torch.testing.assert_close(got, twin, rtol=1e-2, atol=1e-2)


def test_tile_plan_covers_each_row_once_within_its_expert():
    counts = torch.tensor([3, 0, 17, 1, 0, 32])
    expert, start, end = expert_tiles(counts, int(counts.sum()))
    owner = torch.repeat_interleave(torch.arange(6), counts)
    seen = []
    for e, s, t in zip(expert.tolist(), start.tolist(), end.tolist(), strict=True):
        rows = list(range(s, min(s + BLOCK_M, t)))
        assert all(owner[r] == e for r in rows)
        seen += rows
    assert sorted(seen) == list(range(int(counts.sum())))


def test_bad_operands_are_refused_by_name():
    x, weight = torch.randn(4, 8), torch.randn(2, 5, 8)
    with pytest.raises(ValueError, match="K=7"):
        grouped_gemm(torch.randn(4, 7), weight, torch.tensor([2, 2]))
    with pytest.raises(ValueError, match=r"counts must be \[2\]"):
        grouped_gemm(x, weight, torch.tensor([4]))
    with pytest.raises(ValueError, match="share one of"):
        grouped_gemm(x.double(), weight.double(), torch.tensor([2, 2]))
    with pytest.raises(ValueError, match=r"row_scale must be \[4\]"):
        grouped_gemm(x, weight, torch.tensor([2, 2]), torch.ones(3))
