"""The cache's own entry check (ReportCorrupt) agrees with the readers': the checksum of
iris_kernels/checksum.py and torch's idea of a non-finite value, for every stored dtype."""

from __future__ import annotations

import pytest
import torch

from embedding_cache_svc import integrity
from embedding_cache_svc.client.tensors import TORCH_DTYPES
from iris_kernels import checksum


@pytest.mark.parametrize("nbytes", [0, 3, 4, 4 * 16384 - 2, 4 * 16384 * 2 + 7])
def test_checksum_matches_the_kernels_definition(nbytes):
    data = torch.randint(0, 256, (nbytes,), dtype=torch.uint8)
    assert integrity.checksum(data.numpy().tobytes()) == checksum(data)


@pytest.mark.parametrize("dtype", list(TORCH_DTYPES))
def test_nonfinite_counts_what_torch_counts(dtype):
    torch_dtype = TORCH_DTYPES[dtype]
    values = torch.randn(64, 8).to(torch_dtype)
    values[3, 1] = float("nan")
    values[7, 0] = -float("nan")
    if dtype != "float8_e4m3fn":  # no infinity there (it saturates to NaN)
        values[9, 5] = float("inf")
    raw = values.view(-1).view(torch.uint8).numpy().tobytes()
    expected = int((~torch.isfinite(values.float())).sum())
    assert integrity.nonfinite(raw, dtype) == expected > 0
    assert integrity.finding(raw, dtype, checksum(values)) == "nonfinite"
    clean = torch.randn(64, 8).to(torch_dtype)
    raw = clean.view(-1).view(torch.uint8).numpy().tobytes()
    assert integrity.finding(raw, dtype, checksum(clean)) == "intact"
    assert integrity.finding(raw, dtype, checksum(clean) ^ 1) == "checksum"
