"""Entries that do not fit a request are a miss for that request and stay; damaged ones
are dropped by the cache's own check; bad input is INVALID_ARGUMENT."""

from __future__ import annotations

import grpc
import pytest
import torch

from embedding_cache_svc.client import CacheClient, CacheInvalidArgument, Status
from embedding_cache_svc.entry import Failed, Header
from embedding_cache_svc.proto import cache_pb2, cache_pb2_grpc
from iris.proto import common_pb2
from iris_kernels import checksum
from tests.embedding_cache_svc.helpers import FINGERPRINT, new_key


def _inject(service, key: bytes, header: Header, data: bytes) -> None:
    """Write straight into the service's store, bypassing Put's checks."""
    service.call(service.store.put(FINGERPRINT + key, header, data))


def _header(tensor: torch.Tensor, **changes) -> Header:
    values = {
        "token_count": tensor.shape[0],
        "hidden": tensor.shape[1],
        "dtype": "float32",
        "checksum": checksum(tensor),
        "fingerprint": FINGERPRINT,
    } | changes
    return Header(**values)


def _discards(service, reason: str) -> float:
    value = service.server.metrics.registry.get_sample_value(
        "iris_cache_validation_discards_total", {"reason": reason}
    )
    return value or 0.0


def test_wrong_token_count_is_a_miss_for_that_caller_and_the_entry_stays(service):
    with CacheClient(service.address, FINGERPRINT) as client:
        key = new_key()
        client.put(key, torch.ones(5, 8), 5)
        assert client.get_many([(key, 4)], 8, torch.float32)[key] is None
        assert client.wait([(key, 4)], 0)[key] == Status.FREE
        assert client.exists([key]) == [True]
        assert client.get_many([(key, 5)], 8, torch.float32)[key].shape == (5, 8)
        # The skewed caller may produce its own; the entry stays for the others.
        assert client.reserve([(key, 6)], 5000) == [Status.RESERVED]
        assert client.reserve([(key, 5)], 5000) == [Status.PRESENT]
        assert client.wait([(key, 5)], 0)[key] == Status.PRESENT


def test_a_failure_is_recorded_per_token_count(service):
    with CacheClient(service.address, FINGERPRINT) as client:
        key = new_key()
        client.fail(key, "vision tower produced 6 rows, expected 4", 4)
        assert client.reserve([(key, 4)], 5000) == [
            Failed("vision tower produced 6 rows, expected 4")
        ]
        assert client.get_many([(key, 4)], 8, torch.float32)[key] == Failed(
            "vision tower produced 6 rows, expected 4"
        )
        # Another count is not failed: its caller reserves and produces it.
        assert client.get_many([(key, 6)], 8, torch.float32)[key] is None
        assert client.reserve([(key, 6)], 5000) == [Status.RESERVED]
        client.put(key, torch.ones(6, 8), 6)
        assert client.reserve([(key, 6), (key, 4)], 5000) == [
            Status.PRESENT,
            Failed("vision tower produced 6 rows, expected 4"),
        ]
        with pytest.raises(CacheInvalidArgument, match="token_count must be > 0, got 0"):
            client.fail(key, "no count", 0)


def test_wrong_hidden_is_a_miss_and_the_entry_stays(service):
    with CacheClient(service.address, FINGERPRINT) as client:
        key = new_key()
        client.put(key, torch.ones(2, 8), 2)
        assert client.get_many([(key, 2)], 16, torch.float32)[key] is None
        assert client.exists([key]) == [True]


@pytest.mark.parametrize(
    ("stored", "wanted"), [(torch.bfloat16, torch.float32), (torch.float32, torch.bfloat16)]
)
def test_another_dtype_is_converted_on_read_not_a_miss(service, stored, wanted):
    tensor = torch.randn(3, 8).to(stored)
    with CacheClient(service.address, FINGERPRINT) as client:
        key = new_key()
        client.put(key, tensor, 3)
        got = client.get_many([(key, 3)], 8, wanted)[key]
        assert got is not None and got.dtype == wanted
        assert torch.equal(got, tensor.to(wanted))
        assert client.exists([key]) == [True]  # kept for the next reader


def test_wrong_checksum_is_reported_by_the_client_and_dropped_by_the_cache(service):
    tensor = torch.randn(4, 8)
    key = new_key()
    _inject(service, key, _header(tensor, checksum=checksum(tensor) ^ 1), tensor.numpy().tobytes())
    before = _discards(service, "checksum")
    with CacheClient(service.address, FINGERPRINT) as client:
        assert client.get_many([(key, 4)], 8, torch.float32)[key] is None
        assert client.exists([key]) == [False]  # reported; the cache's own check agreed
    assert _discards(service, "checksum") == before + 1


def test_report_corrupt_drops_only_what_the_cache_finds_damaged(service):
    with CacheClient(service.address, FINGERPRINT) as client:
        intact, poisoned, absent = new_key(), new_key(), new_key()
        client.put(intact, torch.randn(3, 8), 3)
        reply = client.report_corrupt(intact, "NaN seen")
        assert (reply.dropped, reply.finding) == (False, "intact")
        assert client.exists([intact]) == [True]
        bad = torch.randn(3, 8).to(torch.bfloat16)
        bad[1, 2] = float("nan")
        client.put(poisoned, bad, 3)
        reply = client.report_corrupt(poisoned, "items[0] embedding has 1 NaN")
        assert (reply.dropped, reply.finding) == (True, "nonfinite")
        assert client.exists([poisoned]) == [False]
        assert client.reserve([(poisoned, 3)], 5000) == [Status.RESERVED]  # re-encoded next
        reply = client.report_corrupt(absent, "checksum")
        assert (reply.dropped, reply.finding) == (False, "absent")


def test_truncated_body_is_discarded_by_the_service(service):
    tensor = torch.randn(300, 1024)  # several chunks, so the cut lands mid-stream
    key = new_key()
    _inject(service, key, _header(tensor), tensor.numpy().tobytes()[:-4096])
    before = _discards(service, "truncated")
    with CacheClient(service.address, FINGERPRINT) as client:
        assert client.get_many([(key, 300)], 1024, torch.float32)[key] is None
        assert client.exists([key]) == [False]
    assert _discards(service, "truncated") == before + 1


def _put_raw(address: str, messages) -> grpc.RpcError:
    with grpc.insecure_channel(address) as channel:
        stub = cache_pb2_grpc.EmbeddingCacheStub(channel)
        with pytest.raises(grpc.RpcError) as info:
            stub.Put(iter(messages), timeout=5)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT, info.value.details()
    return info.value


def _first(key=None, rows=2, hidden=4, dtype="float32", shape=None, fingerprint=FINGERPRINT):
    tensor = common_pb2.TensorHeader(dtype=dtype, shape=shape or [rows, hidden], checksum=1)
    header = cache_pb2.EntryHeader(token_count=rows, hidden=hidden, tensor=tensor)
    return cache_pb2.PutChunk(fingerprint=fingerprint, key=key or new_key(), header=header)


def test_put_refuses_bad_input_naming_value_and_limit(service):
    address = service.address
    err = _put_raw(address, [_first(), cache_pb2.PutChunk(data=b"x" * 31)])
    assert "31 bytes sent" in err.details() and "32" in err.details()
    err = _put_raw(address, [_first(), cache_pb2.PutChunk(data=b"x" * 40)])
    assert "32" in err.details()
    assert "int4" in _put_raw(address, [_first(dtype="int4")]).details()
    assert "[3, 4]" in _put_raw(address, [_first(shape=[3, 4])]).details()
    assert "7 bytes" in _put_raw(address, [_first(key=b"1234567")]).details()
    assert "5 bytes" in _put_raw(address, [_first(fingerprint=b"short")]).details()
    limit = service.server.settings.max_entry_bytes
    err = _put_raw(address, [_first(rows=limit // 4096 + 1, hidden=1024)])
    assert str(limit) in err.details()


def test_other_calls_refuse_bad_input(service):
    with CacheClient(service.address, FINGERPRINT) as client:
        with pytest.raises(CacheInvalidArgument, match="lease_ms"):
            client.reserve([(new_key(), 1)], 0)
        with pytest.raises(CacheInvalidArgument, match="9 bytes"):
            client.exists([b"123456789"])
        with pytest.raises(CacheInvalidArgument, match="rows"):
            client.put(new_key(), torch.ones(3, 4), 2)
        with pytest.raises(CacheInvalidArgument, match="int64"):
            client.put(new_key(), torch.ones(3, 4, dtype=torch.int64), 3)
    with grpc.insecure_channel(service.address) as channel:
        stub = cache_pb2_grpc.EmbeddingCacheStub(channel)
        limit = service.server.settings.max_lease_ms
        item = cache_pb2.ItemRequest(key=new_key(), token_count=1)
        request = cache_pb2.ReserveRequest(
            fingerprint=FINGERPRINT, items=[item], lease_ms=limit + 1
        )
        with pytest.raises(grpc.RpcError) as info:
            stub.Reserve(request, timeout=5)
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert str(limit) in info.value.details()
        request = cache_pb2.FailRequest(
            fingerprint=FINGERPRINT, key=new_key(), reason="x" * 5000, token_count=2
        )
        with pytest.raises(grpc.RpcError) as info:
            stub.Fail(request, timeout=5)
        assert "5000" in info.value.details() and "1024" in info.value.details()
        request = cache_pb2.BatchGetRequest(fingerprint=FINGERPRINT, items=[item], dtype="int4")
        with pytest.raises(grpc.RpcError) as info:
            list(stub.BatchGet(request, timeout=5))
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_a_drop_keeps_an_entry_replaced_since_it_was_checked(service):
    key = FINGERPRINT + new_key()
    checked, fresh = torch.ones(2, 8), torch.zeros(2, 8)
    service.call(service.store.put(key, _header(fresh), fresh.numpy().tobytes()))
    # The entry found damaged was `checked`; a Put replaced it meanwhile: it stays.
    assert service.call(service.store.discard(key, _header(checked))) is False
    assert service.call(service.store.exists([key])) == [True]
    assert service.call(service.store.discard(key, _header(fresh))) is True
    assert service.call(service.store.exists([key])) == [False]
