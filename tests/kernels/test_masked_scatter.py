"""masked_scatter_rows: row-wise torch.masked_scatter, and never a silent short source."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from kernels import masked_scatter_rows

DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def reference(dest, mask, src):
    out = dest.clone()
    k = 0
    for row in range(dest.shape[0]):
        if mask[row]:
            out[row] = src[k]
            k += 1
    return out


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("n", "d", "extra"), [(1, 1, 0), (17, 37, 0), (10, 130, 3), (5, 2049, 1)])
def test_triton_equals_twin_and_masked_scatter(runs_on, dtype, n, d, extra):
    generator = torch.Generator().manual_seed(n + d)
    dest = torch.randn(n, d, generator=generator).to(dtype)
    mask = torch.rand(n, generator=generator) < 0.5
    mask[0] = True
    src = torch.randn(int(mask.sum()) + extra, d, generator=generator).to(dtype)
    expected = reference(dest, mask, src)
    with runs_on("masked_scatter_rows", "triton"):
        triton_out = masked_scatter_rows(dest.clone(), mask, src, backend="triton")
    with runs_on("masked_scatter_rows", "torch"):
        torch_out = masked_scatter_rows(dest.clone(), mask, src, backend="torch")
    assert torch.equal(triton_out, expected)
    assert torch.equal(torch_out, expected)
    assert torch.equal(expected, dest.masked_scatter(mask.unsqueeze(1).expand_as(dest), src))


@pytest.mark.parametrize("backend", ["triton", "torch"])
def test_fewer_source_rows_than_mask_is_an_error(backend):
    dest = torch.zeros(6, 4)
    mask = torch.tensor([1, 0, 1, 1, 0, 1], dtype=torch.bool)
    with pytest.raises(ValueError, match="selects 4 rows but src has only 3"):
        masked_scatter_rows(dest, mask, torch.ones(3, 4), backend=backend)
    assert dest.abs().sum() == 0


@pytest.mark.parametrize("backend", ["triton", "torch"])
def test_empty_mask_and_empty_dest(backend):
    dest = torch.randn(3, 5)
    before = dest.clone()
    masked_scatter_rows(dest, torch.zeros(3, dtype=torch.bool), torch.empty(0, 5), backend=backend)
    assert torch.equal(dest, before)
    empty = torch.empty(0, 5)
    masked_scatter_rows(empty, torch.zeros(0, dtype=torch.bool), torch.empty(0, 5), backend=backend)


def test_strided_source_rows():
    dest = torch.zeros(4, 3)
    mask = torch.tensor([0, 1, 1, 0], dtype=torch.bool)
    src = torch.arange(12, dtype=torch.float32).reshape(4, 3)[::2]  # rows 0 and 2
    out = masked_scatter_rows(dest.clone(), mask, src, backend="triton")
    assert torch.equal(out, masked_scatter_rows(dest.clone(), mask, src, backend="torch"))
    assert torch.equal(out[1], torch.tensor([0.0, 1, 2])) and torch.equal(out[2], src[1])


@pytest.mark.parametrize(
    ("mask", "message"),
    [
        (torch.ones(4, dtype=torch.uint8), "mask must be bool"),
        (torch.ones(3, dtype=torch.bool), r"mask must be bool \[4\]"),
        (torch.ones(4, 1, dtype=torch.bool), "mask must be bool"),
        (torch.ones(4, dtype=torch.bool, device="meta"), "device differs"),
    ],
)
def test_mask_checks(mask, message):
    with pytest.raises(ValueError, match=message):
        masked_scatter_rows(torch.zeros(4, 2), mask, torch.zeros(4, 2))


@settings(max_examples=12, deadline=None)
@given(
    mask=st.lists(st.booleans(), min_size=0, max_size=30),
    d=st.integers(1, 70),
    extra=st.integers(0, 3),
    dtype=st.sampled_from(DTYPES),
)
def test_property_triton_equals_reference(mask, d, extra, dtype):
    mask = torch.tensor(mask, dtype=torch.bool)
    dest = torch.randn(mask.numel(), d).to(dtype)
    src = torch.randn(int(mask.sum()) + extra, d).to(dtype)
    expected = reference(dest, mask, src)
    assert torch.equal(masked_scatter_rows(dest.clone(), mask, src, backend="triton"), expected)
    assert torch.equal(masked_scatter_rows(dest.clone(), mask, src, backend="torch"), expected)
