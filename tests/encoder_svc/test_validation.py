"""Malformed requests are refused before any work, naming the value and the limit."""

from __future__ import annotations

import grpc
import pytest

from iris.proto import common_pb2
from tests.encoder_svc.stack import encode_item, png

INVALID = grpc.StatusCode.INVALID_ARGUMENT


def _without_image(item):
    empty = type(item)()
    empty.CopyFrom(item)
    empty.image = b""
    return empty


def _cases(qwen):
    image = png(51, 96, 96)
    good = encode_item(qwen, image)
    return [
        ("short identity", [encode_item(qwen, image, identity=b"x" * 31)], INVALID,
         "items[0]: identity is 31 bytes, expected 32"),
        ("no key", [encode_item(qwen, image, identity=b"", hash=0)], INVALID,
         "items[0]: item has neither identity nor hash"),
        ("hash disagrees", [good, encode_item(qwen, image, hash=1)], INVALID,
         "items[1]: hash 0000000000000001 is not the identity's first 8 bytes"),
        ("zero tokens", [encode_item(qwen, image, token_count=0)], INVALID,
         "items[0]: token_count must be > 0"),
        ("video", [encode_item(qwen, image, modality=common_pb2.VIDEO)], INVALID,
         "items[0]: modality VIDEO is not supported"),
        ("no image", [_without_image(good)], INVALID, "items[0]: image is empty"),
        ("too many", [good] * 5, INVALID, "request has 5 items, over the limit of 4"),
    ]  # fmt: skip


async def test_malformed_requests_are_refused(qwen, stack_factory):
    stack = await stack_factory(qwen, max_items_per_request=4)
    for name, items, code, message in _cases(qwen):
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await stack.encode(items)
        assert refused.value.code() == code, name
        assert message in refused.value.details(), name
    assert stack.runner.calls == []
    assert stack.encoder.batcher.queued() == (0, 0)


async def test_another_models_fingerprint_is_a_failed_precondition(qwen, stack_factory):
    stack = await stack_factory(qwen)
    item = encode_item(qwen, png(52, 96, 96))
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await stack.stub.Encode(stack.request([item], fingerprint=b"\x01" * 32))
    assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "is not this encoder's model" in refused.value.details()
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await stack.stub.Encode(stack.request([item], fingerprint=b"\x01" * 5))
    assert refused.value.code() == INVALID
    assert "fingerprint is 5 bytes, expected 32" in refused.value.details()


async def test_a_callers_64_bit_hash_keys_the_item(qwen, stack_factory):
    stack = await stack_factory(qwen)
    item = encode_item(qwen, png(53, 96, 96), identity=b"", hash=0x0123456789ABCDEF)
    reply = await stack.encode([item])
    assert reply.results[0].ok
    assert reply.results[0].key == bytes.fromhex("0123456789abcdef")
