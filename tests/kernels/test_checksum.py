"""checksum: the documented definition, Triton (interpreted) == twin, and sensitivity."""

import struct

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from iris_kernels import checksum
from iris_kernels.checksum import (
    KEY_COUNT,
    TWIN_BLOCKS_PER_STEP,
    checksum_block_sums_numpy,
    checksum_block_sums_torch,
    keys_on,
)

MASK64 = (1 << 64) - 1


def fmix64(z):
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
    return z ^ (z >> 31)


KEYS = [fmix64(((j + 1) * 0x9E3779B97F4A7C15) & MASK64) | 1 for j in range(KEY_COUNT)]


def definition(data: bytes) -> int:
    """The module docstring's definition, written out in plain Python."""
    padded = data + b"\0" * (-len(data) % 4)
    words = struct.unpack(f"<{len(padded) // 4}i", padded)
    h = fmix64(len(data) ^ 0x6972697363686B31)
    for start in range(0, len(words), KEY_COUNT):
        block = words[start : start + KEY_COUNT]
        block_sum = sum(w * k for w, k in zip(block, KEYS, strict=False)) & MASK64
        h = fmix64(h ^ block_sum)
    return h


def raw(tensor: torch.Tensor) -> bytes:
    return tensor.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()


def random_bytes(n: int, seed: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (n,), dtype=torch.uint8, generator=generator)


@pytest.mark.parametrize("n", [0, 1, 2, 3, 4, 5, 7, 8, 100, 4 * KEY_COUNT, 4 * KEY_COUNT * 2 + 6])
def test_both_backends_follow_the_definition(runs_on, n):
    data = random_bytes(n, seed=n)
    expected = definition(raw(data))
    with runs_on("checksum", "torch"):
        assert checksum(data, backend="torch") == expected
    with runs_on("checksum", "triton"):
        assert checksum(data, backend="triton") == expected
    assert 0 <= expected <= MASK64


@pytest.mark.parametrize("blocks", [0, 1, TWIN_BLOCKS_PER_STEP + 3])
@pytest.mark.parametrize("tail", [0, 1, 999])
def test_numpy_and_torch_block_sums_agree(blocks, tail):
    # The CPU twin uses numpy; the torch-op twin (for GPUs in twin mode) must match it.
    generator = torch.Generator().manual_seed(blocks * 1000 + tail)
    words = torch.randint(-(2**31), 2**31, (blocks * KEY_COUNT + tail,), generator=generator)
    words = words.to(torch.int32)
    sums = checksum_block_sums_numpy(words)
    assert sums == checksum_block_sums_torch(words)
    assert len(sums) == blocks + (1 if tail else 0)


def test_keys_are_odd_and_distinct_mod_2_33():
    # The docstring's guarantee that swapping two words of a block is always detected.
    assert all(k & 1 for k in KEYS)
    assert len({k % (1 << 33) for k in KEYS}) == KEY_COUNT
    assert [k & MASK64 for k in keys_on(torch.device("cpu")).tolist()] == KEYS


def test_pinned_value():
    # Checksums are stored beside cached embeddings: the definition must not drift.
    assert checksum(torch.arange(10, dtype=torch.int32)) == definition(
        struct.pack("<10i", *range(10))
    )
    assert checksum(torch.arange(10, dtype=torch.int32)) == 0xD10C5BB169B03D69


@pytest.mark.parametrize(
    "tensor",
    [
        torch.randn(37, 129).to(torch.bfloat16),
        torch.randn(5, 3, 7).to(torch.float16),
        torch.randn(1000),
        torch.randn(6, 10).to(torch.float8_e4m3fn),
        torch.randint(-(2**62), 2**62, (77,)),
        torch.rand(9) < 0.5,
        torch.tensor(3.5),
        torch.randn(300, 301).to(torch.bfloat16)[:, 7:200],  # not contiguous
        torch.randn(64, 64).t(),  # transposed
        torch.randint(0, 256, (1001,), dtype=torch.uint8)[3:],  # unaligned start
    ],
    ids=[
        "bf16",
        "fp16-3d",
        "fp32",
        "fp8",
        "int64",
        "bool",
        "scalar",
        "sliced",
        "transposed",
        "unaligned",
    ],
)
def test_any_dtype_and_layout_is_its_contiguous_bytes(tensor):
    expected = definition(raw(tensor))
    assert checksum(tensor, backend="torch") == expected
    assert checksum(tensor, backend="triton") == expected
    assert checksum(tensor.contiguous()) == expected


def test_bytes_not_dtype_or_shape():
    values = torch.randn(12, 8)
    assert checksum(values) == checksum(values.view(torch.int32)) == checksum(values.view(96))


def test_single_byte_changes_are_detected():
    data = random_bytes(3 * 4 * KEY_COUNT + 3, seed=1)
    base = checksum(data)
    for position in (0, 1, 4 * KEY_COUNT - 1, 4 * KEY_COUNT, data.numel() // 2, data.numel() - 1):
        for flip in (1, 0x80, 0xFF):
            changed = data.clone()
            changed[position] ^= flip
            assert checksum(changed) != base, (position, flip)
            assert checksum(changed, backend="triton") == checksum(changed)


def test_swaps_and_length_are_detected():
    words = torch.arange(3 * KEY_COUNT, dtype=torch.int32) * 7919
    base = checksum(words)
    for i, j in ((0, 1), (5, 9000), (KEY_COUNT - 1, KEY_COUNT), (10, 2 * KEY_COUNT + 10)):
        swapped = words.clone()
        swapped[[i, j]] = words[[j, i]]
        assert checksum(swapped) != base, (i, j)
    blocks = words.view(3, KEY_COUNT)
    assert checksum(blocks[[1, 0, 2]]) != base
    assert checksum(torch.cat([words, torch.zeros(1, dtype=torch.int32)])) != base
    zero_bytes = torch.zeros(8, dtype=torch.uint8)
    assert len({checksum(zero_bytes[:n]) for n in range(9)}) == 9


def test_refuses_tensors_without_bytes():
    with pytest.raises(ValueError, match="dense tensor"):
        checksum(torch.zeros(3, device="meta"))
    with pytest.raises(ValueError, match="dense tensor"):
        checksum(torch.eye(3).to_sparse())


@settings(max_examples=20, deadline=None)
@given(data=st.binary(max_size=300), position=st.integers(0, 299), flip=st.integers(1, 255))
def test_property_backends_agree_and_flips_change(data, position, flip):
    tensor = (
        torch.frombuffer(bytearray(data), dtype=torch.uint8)
        if data
        else torch.empty(0, dtype=torch.uint8)
    )
    value = checksum(tensor, backend="torch")
    assert value == checksum(tensor, backend="triton") == definition(data)
    if data:
        changed = tensor.clone()
        changed[position % len(data)] ^= flip
        assert checksum(changed, backend="triton") != value
