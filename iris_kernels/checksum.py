"""Tensor checksum: an unsigned 64-bit value of a tensor's raw bytes.

The embedding cache stamps it on every put and its consumers verify it after transfer, so it
must agree across the Triton kernel, the torch twin, and devices, and the twin must be fast
on a CPU. Definition (all arithmetic mod 2^64):

1. `data` = the tensor's bytes in contiguous (row-major) order, `L = len(data)`; dtype and
   shape are not part of the value.
2. `data` is zero-padded to a multiple of 4 bytes and read as little-endian int32 words
   `w[0..n)`, each sign-extended to 64 bits.
3. Keys: `k[j] = fmix64((j + 1) * 0x9E3779B97F4A7C15) | 1` for j in [0, P), P = 16384,
   where fmix64(z) = z ^= z >> 30; z *= 0xBF58476D1CE4E5B9; z ^= z >> 27;
   z *= 0x94D049BB133111EB; z ^= z >> 31 (the SplitMix64 finaliser).
4. Block sums: `s[b] = Σ_j w[b·P + j] · k[j]` over the words of block b (words past n are 0).
5. `h = fmix64(L ^ 0x6972697363686B31)`; for each block b in order: `h = fmix64(h ^ s[b])`.
   The checksum is h.

Since every key is odd, changing any one word (any bytes within it) changes its block sum,
and the chain of bijections carries that to h. Swapping two different words of one block
changes the sum by (w_i − w_j)(k_j − k_i): the first factor has at most 31 trailing zero
bits and, as no two keys agree mod 2^33 (checked by the tests), the second at most 32, so
the product is never 0 mod 2^64. Changes in several blocks, blocks swapped, or the length
changed (trailing zero bytes) change h except with ~2^-64 chance. It is a transfer check,
not a cryptographic hash. The block sums are a wrapping multiply-add (the Triton kernel; on
a CPU numpy's einsum, on a GPU torch ops); only the short chain over blocks runs in Python.
"""

from __future__ import annotations

import sys

import numpy as np
import torch
import triton
import triton.language as tl

from iris_kernels.backend import jit, resolve_backend

MASK64 = (1 << 64) - 1
GOLDEN = 0x9E3779B97F4A7C15
LENGTH_TAG = 0x6972697363686B31  # b"irischk1"
KEY_COUNT = 16384  # P: words per block
BLOCK_SIZE = 2048  # words per Triton program; divides KEY_COUNT
TWIN_BLOCKS_PER_STEP = 16  # the torch twin's working set: 16 blocks × 16384 words × 8 B = 2 MiB

assert sys.byteorder == "little", "words are read in host byte order"
assert KEY_COUNT % BLOCK_SIZE == 0


def fmix64(z: int) -> int:
    """The SplitMix64 finaliser on a Python int (a bijection of 64-bit values)."""
    z &= MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
    return z ^ (z >> 31)


def _make_keys() -> torch.Tensor:
    # Same fmix64 vectorised in uint64, whose arithmetic wraps like the definition's.
    z = np.arange(1, KEY_COUNT + 1, dtype=np.uint64) * np.uint64(GOLDEN)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    z = (z ^ (z >> np.uint64(31))) | np.uint64(1)
    return torch.from_numpy(z.view(np.int64))


_KEYS = {torch.device("cpu"): _make_keys()}


def keys_on(device: torch.device) -> torch.Tensor:
    """The P keys of the definition (int64 bit patterns), cached per device."""
    keys = _KEYS.get(device)
    if keys is None:
        keys = _KEYS[device] = _KEYS[torch.device("cpu")].to(device)
    return keys


# Inside the kernel this name is the sum combiner for the mode it was built in (see
# iris_kernels.backend.jit); the module-level value is never used.
SUM_COMBINE = None


@jit(sum_combine="SUM_COMBINE")
def _checksum_kernel(
    words_ptr,
    keys_ptr,
    out_ptr,
    n,
    KEY_COUNT: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
):
    # One program reduces BLOCK_SIZE words; a program never straddles two key blocks
    # because BLOCK_SIZE divides KEY_COUNT.
    pid = tl.program_id(0).to(tl.int64)
    offsets = pid * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    # Words past the end count as zero, exactly like the definition's padding.
    words = tl.load(words_ptr + offsets, mask=offsets < n, other=0).to(tl.int64)
    keys = tl.load(keys_ptr + (offsets % KEY_COUNT))
    # int64 multiply and sum wrap mod 2^64, so any reduction order gives the same bits.
    tl.store(out_ptr + pid, tl.reduce(words * keys, 0, SUM_COMBINE))


def _words(tensor: torch.Tensor) -> tuple[torch.Tensor, int]:
    """The tensor's contiguous bytes as int32 words (zero-padded) and its byte length."""
    data = tensor.detach().contiguous().reshape(-1).view(torch.uint8)
    length = data.numel()
    if length % 4 or data.storage_offset() % 4:
        # Rare (odd byte lengths, unaligned views): pay one copy into an aligned buffer.
        padded = torch.zeros(triton.cdiv(length, 4) * 4, dtype=torch.uint8, device=data.device)
        padded[:length] = data
        data = padded
    return data.view(torch.int32), length


def _fold(length: int, block_sums: list[int]) -> int:
    h = fmix64(length ^ LENGTH_TAG)
    for block_sum in block_sums:
        h = fmix64(h ^ (block_sum & MASK64))
    return h


def checksum(tensor: torch.Tensor, *, backend: str | None = None) -> int:
    """The unsigned 64-bit checksum of the tensor's contiguous bytes (module docstring).

    Any dtype, shape or strides; equal for the same bytes on either backend and any device.
    Raises ValueError for sparse or meta tensors (they have no bytes to read).
    """
    if tensor.layout != torch.strided or tensor.device.type == "meta":
        raise ValueError(
            f"checksum needs a dense tensor with data, got {tensor.layout} on {tensor.device}"
        )
    words, length = _words(tensor)
    if resolve_backend("checksum", backend, tensor.device) == "torch":
        return _fold(length, block_sums(words))
    n = words.numel()
    blocks = triton.cdiv(n, KEY_COUNT)
    if blocks == 0:
        return _fold(length, [])
    tiles_per_block = KEY_COUNT // BLOCK_SIZE
    # Tiles past the last word stay zero, so each block's tile sums add up to s[b].
    tile_sums = torch.zeros(blocks * tiles_per_block, dtype=torch.int64, device=words.device)
    grid = (triton.cdiv(n, BLOCK_SIZE),)
    _checksum_kernel[grid](
        words,
        keys_on(words.device),
        tile_sums,
        n,
        KEY_COUNT=KEY_COUNT,
        BLOCK_SIZE=BLOCK_SIZE,
    )
    return _fold(length, tile_sums.view(blocks, tiles_per_block).sum(1).tolist())


def block_sums(words: torch.Tensor) -> list[int]:
    """The twin's block sums s[b] of int32 words (definition step 4), as Python ints."""
    if words.device.type == "cpu":
        return checksum_block_sums_numpy(words)
    return checksum_block_sums_torch(words)


def checksum_block_sums_numpy(words: torch.Tensor) -> list[int]:
    """Block sums of CPU words with numpy's einsum.

    einsum widens the int32 words to int64 in small buffers and runs one thread, so it keeps
    its speed (≈ 6 GB/s here) when other processes load the cores, where torch's two-thread
    ops stall at every barrier (measured 0.8 GB/s median under load).
    """
    keys = _KEYS[torch.device("cpu")].numpy()
    flat = words.numpy()
    full = flat.size // KEY_COUNT
    sums = []
    if full:
        head = flat[: full * KEY_COUNT].reshape(full, KEY_COUNT)
        sums = np.einsum("bp,p->b", head, keys).tolist()
    tail = flat[full * KEY_COUNT :]
    if tail.size:
        sums.append(int(np.einsum("p,p->", tail, keys[: tail.size], dtype=np.int64)))
    return sums


def checksum_block_sums_torch(words: torch.Tensor) -> list[int]:
    """Block sums with torch ops on the words' device (the twin on a GPU).

    Works through TWIN_BLOCKS_PER_STEP blocks at a time into one reused int64 buffer, so the
    products stay in cache instead of streaming a tensor twice the input's size.
    """
    keys = keys_on(words.device)
    n = words.numel()
    full = n // KEY_COUNT
    sums = torch.empty(full + (1 if n % KEY_COUNT else 0), dtype=torch.int64, device=words.device)
    if full:
        blocks = words[: full * KEY_COUNT].view(full, KEY_COUNT)
        step = TWIN_BLOCKS_PER_STEP
        products = torch.empty(min(step, full), KEY_COUNT, dtype=torch.int64, device=words.device)
        for first in range(0, full, step):
            chunk = blocks[first : first + step]
            product = products[: chunk.shape[0]]
            torch.mul(chunk, keys, out=product)
            torch.sum(product, 1, out=sums[first : first + chunk.shape[0]])
    if n % KEY_COUNT:
        tail = words[full * KEY_COUNT :]
        sums[full] = (tail.to(torch.int64) * keys[: tail.numel()]).sum()
    return sums.tolist()
