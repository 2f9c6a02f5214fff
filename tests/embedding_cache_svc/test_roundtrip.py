"""Put / BatchGet round trips of every dtype, through real gRPC, on both stores."""

from __future__ import annotations

import pytest
import torch

from embedding_cache_svc.client import AsyncCacheClient, CacheClient, Failed
from embedding_cache_svc.client.tensors import TORCH_DTYPES
from tests.embedding_cache_svc.helpers import FINGERPRINT, new_key


def _embedding(rows: int, hidden: int, dtype: torch.dtype, seed: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    values = torch.randn(rows, hidden, generator=generator)
    return values.to(dtype)


def _same_bytes(a: torch.Tensor, b: torch.Tensor) -> bool:
    return (
        a.dtype == b.dtype
        and a.shape == b.shape
        and torch.equal(a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8))
    )


@pytest.mark.parametrize("dtype_name", sorted(TORCH_DTYPES))
def test_round_trip_every_dtype(service, dtype_name):
    dtype = TORCH_DTYPES[dtype_name]
    with CacheClient(service.address, FINGERPRINT) as client:
        key, tensor = new_key(), _embedding(7, 24, dtype, seed=1)
        assert client.put(key, tensor, 7) == tensor.numel() * tensor.element_size()
        got = client.get_many([(key, 7)], 24, dtype)[key]
        assert _same_bytes(got, tensor)


def test_large_entry_moves_in_chunks_and_hash_keys_work(service):
    # 12 MiB: three times gRPC's default 4 MiB message limit, with a 64-bit hash key.
    tensor = _embedding(1536, 2048, torch.float32, seed=2)
    key = new_key(8)
    with CacheClient(service.address, FINGERPRINT) as client:
        client.put(key, tensor, 1536)
        assert _same_bytes(client.get_many([(key, 1536)], 2048, torch.float32)[key], tensor)


async def test_async_client_round_trip_and_batch(service):
    async with AsyncCacheClient(service.address, FINGERPRINT) as client:
        tensors = {new_key(): _embedding(n, 16, torch.bfloat16, seed=n) for n in (1, 5, 300)}
        for key, tensor in tensors.items():
            await client.put(key, tensor, tensor.shape[0])
        missing = new_key()
        requests = [(key, t.shape[0]) for key, t in tensors.items()] + [(missing, 4)]
        got = await client.get_many(requests, 16, torch.bfloat16)
        assert got[missing] is None
        for key, tensor in tensors.items():
            assert _same_bytes(got[key], tensor)


def test_exists_delete_fail_and_stats(service):
    with CacheClient(service.address, FINGERPRINT) as client:
        present, failed, absent = new_key(), new_key(), new_key()
        client.put(present, torch.ones(3, 8), 3)
        client.fail(failed, "image does not decode: truncated PNG", 3)
        assert client.exists([present, failed, absent]) == [True, False, False]
        got = client.get_many([(present, 3), (failed, 3), (absent, 3)], 8, torch.float32)
        assert got[failed] == Failed("image does not decode: truncated PNG")
        assert got[absent] is None and got[present].shape == (3, 8)
        assert client.delete([present, absent]) == 1
        assert client.exists([present]) == [False]
        stats = client.stats()
        assert stats["store"] == service.store.name
        assert stats["hits"] >= 1 and stats["misses"] >= 2


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_put_from_gpu_checksums_on_device_and_matches_on_host(memory_service):
    tensor = _embedding(64, 256, torch.bfloat16, seed=3).cuda()
    key = new_key()
    with CacheClient(memory_service.address, FINGERPRINT) as client:
        client.put(key, tensor, 64)  # checksum taken by the Triton kernel on the GPU
        got = client.get_many([(key, 64)], 256, torch.bfloat16)[key]  # verified on the CPU
    assert got is not None and _same_bytes(got, tensor.cpu())
