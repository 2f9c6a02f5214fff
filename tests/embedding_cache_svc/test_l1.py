"""The client's L1: byte-bounded LRU, zero-copy hits, held entries never evicted."""

from __future__ import annotations

import pytest
import torch

from embedding_cache_svc.client import CacheClient, L1Cache
from tests.embedding_cache_svc.helpers import FINGERPRINT, new_key

KB = 1024


def _tensor(rows: int) -> torch.Tensor:
    return torch.zeros(rows, 64)  # 256 bytes per row


def test_lru_evicts_oldest_unheld_within_budget():
    l1 = L1Cache(4 * KB)
    for name in (b"a", b"b", b"c", b"d"):
        assert l1.put(name, _tensor(4), 4, 64, "float32")  # 1 KiB each
    assert l1.get(b"a", 4, 64, "float32") is not None  # a is now the most recent
    assert l1.put(b"e", _tensor(4), 4, 64, "float32")
    assert b"b" not in l1 and b"a" in l1
    assert l1.bytes == 4 * KB and l1.evictions == 1


def test_held_entries_survive_pressure_and_go_after_release():
    l1 = L1Cache(2 * KB)
    l1.put(b"held", _tensor(4), 4, 64, "float32", hold=True)
    l1.put(b"x", _tensor(4), 4, 64, "float32")
    # 3 KiB more: everything unheld goes, the held entry stays (above budget if need be).
    assert l1.put(b"big", _tensor(12), 12, 64, "float32", hold=True)
    assert b"held" in l1 and b"big" in l1 and b"x" not in l1
    assert not l1.put(b"y", _tensor(4), 4, 64, "float32")  # no room without evicting holds
    l1.release([b"held", b"big"])
    assert l1.bytes <= 2 * KB and b"held" not in l1


def test_hit_is_zero_copy_and_properties_are_checked():
    l1 = L1Cache(16 * KB)
    tensor = _tensor(4)
    l1.put(b"k", tensor, 4, 64, "float32")
    assert l1.get(b"k", 4, 64, "float32") is tensor
    assert l1.get(b"k", 5, 64, "float32") is None  # wrong token count: dropped
    assert b"k" not in l1


def test_held_context_manager_counts_holds():
    l1 = L1Cache(16 * KB)
    l1.put(b"k", _tensor(1), 1, 64, "float32")
    with l1.held([b"k", b"absent"]) as pinned, l1.held([b"k"]):
        assert pinned == [b"k"] and l1.holds(b"k") == 2
    assert l1.holds(b"k") == 0


def test_negative_capacity_is_refused():
    with pytest.raises(ValueError, match="-1"):
        L1Cache(-1)


def test_get_many_serves_from_l1_and_holds_across_service_eviction(service):
    key = new_key()
    tensor = torch.randn(6, 32)
    with CacheClient(service.address, FINGERPRINT, l1_bytes=1 << 20) as client:
        client.put(key, tensor, 6)
        first = client.get_many([(key, 6)], 32, torch.float32, hold=True)[key]
        assert torch.equal(first, tensor)
        client.delete([key])  # the shared tier loses it mid-assembly...
        again = client.get_many([(key, 6)], 32, torch.float32)[key]
        assert again is first  # ...the held L1 copy still answers, without a copy
        client.release([key])
        assert client.stats()["l1"]["hits"] == 1
