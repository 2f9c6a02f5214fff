"""scatter_rows: the Triton kernel (interpreted) against its twin and a plain loop."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from iris_kernels import scatter_rows

DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def reference(dest, src, rows):
    out = dest.clone()
    for i, row in enumerate(rows):
        out[row] = src[i]
    return out


def random_case(n, d, m, dtype, seed):
    generator = torch.Generator().manual_seed(seed)
    dest = torch.randn(n, d, generator=generator).to(dtype)
    src = torch.randn(m, d, generator=generator).to(dtype)
    rows = torch.randperm(n, generator=generator)[:m]
    return dest, src, rows


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("n", "d", "m"), [(1, 1, 1), (13, 37, 5), (9, 130, 9), (6, 2049, 3)])
def test_triton_equals_twin_on_ragged_shapes(runs_on, dtype, n, d, m):
    dest, src, rows = random_case(n, d, m, dtype, seed=n * d + m)
    expected = reference(dest, src, rows.tolist())
    with runs_on("scatter_rows", "triton"):
        triton_out = scatter_rows(dest.clone(), src, rows, backend="triton")
    with runs_on("scatter_rows", "torch"):
        torch_out = scatter_rows(dest.clone(), src, rows, backend="torch")
    assert torch.equal(triton_out, expected)
    assert torch.equal(torch_out, expected)


@pytest.mark.parametrize("backend", ["triton", "torch"])
def test_rows_as_list_int32_and_strided_dest(backend):
    wide = torch.zeros(8, 50)
    dest = wide[:, 3:40]  # row stride 50, not the width 37
    src = torch.arange(2 * 37, dtype=torch.float32).reshape(2, 37)
    scatter_rows(dest, src, [6, 1], backend=backend)
    scatter_rows(dest, src[:1] + 1000, torch.tensor([4], dtype=torch.int32), backend=backend)
    assert torch.equal(wide[6, 3:40], src[0]) and torch.equal(wide[1, 3:40], src[1])
    assert torch.equal(wide[4, 3:40], src[0] + 1000)
    assert wide[:, :3].abs().sum() == 0 and wide[:, 40:].abs().sum() == 0
    assert wide[[0, 2, 3, 5, 7]].abs().sum() == 0


@pytest.mark.parametrize("backend", ["triton", "torch"])
def test_no_rows_is_a_no_op(backend):
    dest = torch.randn(4, 10).to(torch.bfloat16)
    before = dest.clone()
    scatter_rows(dest, torch.empty(0, 10, dtype=torch.bfloat16), [], backend=backend)
    assert torch.equal(dest, before)


@pytest.mark.parametrize("backend", ["triton", "torch"])
@pytest.mark.parametrize("bad", [-1, 5, 1 << 40])
def test_row_out_of_range_is_refused_before_writing(backend, bad):
    dest = torch.zeros(5, 3)
    with pytest.raises(ValueError, match=rf"row {bad} outside \[0, 5\)"):
        scatter_rows(dest, torch.ones(2, 3), torch.tensor([0, bad]), backend=backend)
    assert dest.abs().sum() == 0


@pytest.mark.parametrize(
    ("dest", "src", "rows", "message"),
    [
        (torch.zeros(4, 3), torch.zeros(2, 4), [0, 1], "row width differs"),
        (torch.zeros(4, 3), torch.zeros(2, 3, dtype=torch.float16), [0, 1], "dtype differs"),
        (
            torch.zeros(4, 3, dtype=torch.int32),
            torch.zeros(2, 3, dtype=torch.int32),
            [0, 1],
            "not supported",
        ),
        (torch.zeros(4), torch.zeros(2), [0, 1], "must be 2-D"),
        (torch.zeros(3, 4).t(), torch.zeros(2, 3), [0, 1], "rows must be contiguous"),
        (torch.zeros(4, 3), torch.zeros(2, 3), [0, 1, 2], r"shape \[2\]"),
        (torch.zeros(4, 3), torch.zeros(2, 3), torch.tensor([0.0, 1.0]), "integers"),
        (torch.zeros(4, 3), torch.zeros(2, 3, device="meta"), [0, 1], "device differs"),
    ],
)
def test_launcher_checks(dest, src, rows, message):
    with pytest.raises(ValueError, match=message):
        scatter_rows(dest, src, rows)


def test_unknown_backend():
    with pytest.raises(ValueError, match="'cuda' unknown"):
        scatter_rows(torch.zeros(2, 2), torch.zeros(1, 2), [0], backend="cuda")


@settings(max_examples=12, deadline=None)
@given(
    n=st.integers(1, 24),
    d=st.integers(1, 70),
    data=st.data(),
    dtype=st.sampled_from(DTYPES),
)
def test_property_triton_equals_twin(n, d, data, dtype):
    m = data.draw(st.integers(0, n))
    rows = data.draw(st.permutations(range(n)))[:m]
    dest = torch.randn(n, d).to(dtype)
    src = torch.randn(m, d).to(dtype)
    triton_out = scatter_rows(dest.clone(), src, rows, backend="triton")
    torch_out = scatter_rows(dest.clone(), src, rows, backend="torch")
    assert torch.equal(triton_out, torch_out)
    untouched = sorted(set(range(n)) - set(rows))
    assert torch.equal(triton_out[untouched], dest[untouched])
