"""placeholder_mask: isin over the contract's sentinels, Triton (interpreted) against twin."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from iris.multimodal import pad_values_for
from kernels import placeholder_mask

SENTINELS = [v for h in range(9) for v in pad_values_for(h.to_bytes(8, "big"))]  # 36 values


def padded_ids(n, seed):
    """Text ids below 50_000 with every third position a sentinel."""
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, 50_000, (n,), generator=generator)
    picks = torch.randint(0, len(SENTINELS), (n,), generator=generator)
    ids[::3] = torch.tensor(SENTINELS)[picks[::3]]
    return ids


@pytest.mark.parametrize("n", [0, 1, 1023, 1025, 3000])
@pytest.mark.parametrize("count", [0, 1, 4, 17, 36])
def test_triton_equals_twin(runs_on, n, count):
    ids = padded_ids(n, seed=n + count)
    sentinels = SENTINELS[:count]
    expected = torch.tensor([int(v) in set(sentinels) for v in ids], dtype=torch.bool)
    with runs_on("placeholder_mask", "triton"):
        got = placeholder_mask(ids, sentinels, backend="triton")
    with runs_on("placeholder_mask", "torch"):
        twin = placeholder_mask(ids, torch.tensor(sentinels, dtype=torch.int64), backend="torch")
    assert got.dtype == torch.bool and got.shape == (n,)
    assert torch.equal(got, expected)
    assert torch.equal(twin, expected)
    if count == len(SENTINELS) and n:
        assert int(got.sum()) == len(range(0, n, 3))


def test_mask_is_taken_before_clamping():
    ids = torch.tensor([5, SENTINELS[0], 7, SENTINELS[1]])
    mask = placeholder_mask(ids, SENTINELS[:4], backend="triton")
    clamped = ids.clamp(max=49_999)
    assert mask.tolist() == [False, True, False, True]
    assert not placeholder_mask(clamped, SENTINELS[:4]).any()


@pytest.mark.parametrize(
    ("ids", "sentinels", "message"),
    [
        (torch.zeros(3, dtype=torch.int32), [1], "input_ids must be int64"),
        (torch.zeros(2, 3, dtype=torch.int64), [1], r"int64 \[N\]"),
        (torch.zeros(3, dtype=torch.int64), torch.tensor([1], dtype=torch.int32), "sentinels"),
        (torch.zeros(3, dtype=torch.int64), [1 << 63], "does not fit in int64"),
    ],
)
def test_checks(ids, sentinels, message):
    with pytest.raises(ValueError, match=message):
        placeholder_mask(ids, sentinels)


@settings(max_examples=15, deadline=None)
@given(
    ids=st.lists(st.integers(-(2**63), 2**63 - 1), max_size=200),
    sentinels=st.lists(st.integers(-(2**63), 2**63 - 1), max_size=40),
    reuse=st.integers(0, 10),
)
def test_property_triton_equals_isin(ids, sentinels, reuse):
    sentinels = sentinels + ids[:reuse]  # make hits likely
    tensor = torch.tensor(ids, dtype=torch.int64)
    expected = torch.tensor([v in set(sentinels) for v in ids], dtype=torch.bool)
    assert torch.equal(placeholder_mask(tensor, sentinels, backend="triton"), expected)
    assert torch.equal(placeholder_mask(tensor, sentinels, backend="torch"), expected)
