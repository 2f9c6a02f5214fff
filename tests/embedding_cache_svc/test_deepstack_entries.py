"""Deepstack entries (Qwen3-VL): one entry per item holds the main embedding and every
level, row r = main_r ‖ level0_r ‖ … (docs/design/cache.md). Round trips through memory,
Redis and Redis Cluster keep every level bit for bit; a reader expecting another width or
token count misses and the entry stays; a corrupt byte in any level fails the checksum."""

from __future__ import annotations

import pytest
import torch

from embedding_cache_svc.client import CacheClient
from embedding_cache_svc.entry import Header
from iris_kernels import checksum
from tests.embedding_cache_svc.helpers import FINGERPRINT, new_key

HIDDEN, LEVELS, ROWS = 64, 3, 37


def _entry(seed: int, dtype=torch.bfloat16) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """(wide entry [ROWS, (1 + LEVELS) x HIDDEN], [main, level 0, level 1, level 2])."""
    generator = torch.Generator().manual_seed(seed)
    parts = [torch.randn(ROWS, HIDDEN, generator=generator).to(dtype) for _ in range(1 + LEVELS)]
    return torch.cat(parts, dim=1), parts


def test_every_level_round_trips(service):
    wide, parts = _entry(seed=1)
    key = new_key()
    with CacheClient(service.address, FINGERPRINT) as client:
        assert client.put(key, wide, ROWS) == wide.numel() * 2  # (1 + levels) x a plain entry
        got = client.get_many([(key, ROWS)], (1 + LEVELS) * HIDDEN, torch.bfloat16)[key]
        for index, part in enumerate(parts):
            assert torch.equal(got[:, index * HIDDEN : (index + 1) * HIDDEN], part)
        # A reader with another layout (main rows only) or token count misses; the entry stays.
        assert client.get_many([(key, ROWS)], HIDDEN, torch.bfloat16)[key] is None
        assert client.get_many([(key, ROWS + 1)], 4 * HIDDEN, torch.bfloat16)[key] is None
        assert client.exists([key]) == [True]


@pytest.mark.parametrize("level", range(1 + LEVELS))
def test_a_corrupt_level_fails_the_checksum(service, level):
    wide, _ = _entry(seed=2 + level, dtype=torch.float32)
    data = bytearray(wide.numpy().tobytes())
    # One flipped bit in row 20 of this level (the main rows are level "0" here).
    offset = (20 * (1 + LEVELS) * HIDDEN + level * HIDDEN + 5) * 4
    data[offset] ^= 0x10
    header = Header(ROWS, (1 + LEVELS) * HIDDEN, "float32", checksum(wide), FINGERPRINT)
    key = new_key()
    service.call(service.store.put(FINGERPRINT + key, header, bytes(data)))
    with CacheClient(service.address, FINGERPRINT) as client:
        assert client.get_many([(key, ROWS)], (1 + LEVELS) * HIDDEN, torch.float32)[key] is None
        assert client.exists([key]) == [False]  # reported, checked by the cache, dropped
