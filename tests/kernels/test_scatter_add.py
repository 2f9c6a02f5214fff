"""scatter_add_rows (deepstack levels joining the hidden states): the Triton kernel
(interpreted) against its twin and a plain loop, on ragged shapes and strided sources."""

import pytest
import torch

from iris_kernels import interpreting, scatter_add_rows

DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def reference(dest, src, rows):
    out = dest.clone()
    for i, row in enumerate(rows):
        out[row] = out[row] + src[i]
    return out


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("n", "d", "m"), [(1, 1, 1), (13, 37, 5), (9, 130, 9), (6, 2049, 3)])
def test_triton_equals_twin_on_ragged_shapes(runs_on, dtype, n, d, m):
    generator = torch.Generator().manual_seed(n * d + m)
    dest = torch.randn(n, d, generator=generator).to(dtype)
    src = torch.randn(m, d, generator=generator).to(dtype)
    rows = torch.randperm(n, generator=generator)[:m]
    expected = reference(dest, src, rows.tolist())
    with runs_on("scatter_add_rows", "triton"):
        triton_out = scatter_add_rows(dest.clone(), src, rows, backend="triton")
    with runs_on("scatter_add_rows", "torch"):
        torch_out = scatter_add_rows(dest.clone(), src, rows, backend="torch")
    assert torch.equal(torch_out, expected)
    if dtype == torch.bfloat16 and interpreting():
        # Triton's interpreter truncates float32 -> bf16 (the compiled kernel rounds to
        # nearest even, as torch does): allow one bf16 step, far below any wrong addition.
        torch.testing.assert_close(triton_out, expected, rtol=2**-7, atol=2**-7)
    else:
        assert torch.equal(triton_out, expected)
    assert not torch.equal(triton_out, dest)  # it did add something


@pytest.mark.parametrize("backend", ["triton", "torch"])
def test_a_level_sliced_from_a_wide_row_adds_only_its_columns(backend):
    """An entry's row is main ‖ level 0 ‖ level 1: level 1 is a column slice (row stride 3H)."""
    hidden = 5
    wide = torch.arange(2 * 3 * hidden, dtype=torch.float32).reshape(2, 3 * hidden)
    level1 = wide[:, 2 * hidden :]
    dest = torch.ones(4, hidden)
    scatter_add_rows(dest, level1, [3, 0], backend=backend)
    assert torch.equal(dest[3], 1 + wide[0, 2 * hidden :])
    assert torch.equal(dest[0], 1 + wide[1, 2 * hidden :])
    assert torch.equal(dest[1:3], torch.ones(2, hidden))


@pytest.mark.parametrize("backend", ["triton", "torch"])
def test_bad_rows_are_refused_before_writing(backend):
    dest = torch.zeros(5, 3)
    with pytest.raises(ValueError, match=r"row 5 outside \[0, 5\)"):
        scatter_add_rows(dest, torch.ones(2, 3), [0, 5], backend=backend)
    with pytest.raises(ValueError, match="row width differs"):
        scatter_add_rows(dest, torch.ones(2, 4), [0, 1], backend=backend)
    assert dest.abs().sum() == 0
