"""Malformed requests are refused before any work, naming the value and the limit."""

from __future__ import annotations

import grpc
import pytest
import torch

from iris.multimodal import image_identity
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
        ("no identity", [encode_item(qwen, image, identity=b"", hash=0x0123456789ABCDEF)],
         INVALID, "items[0]: identity is 0 bytes, expected 32"),
        ("hash disagrees", [good, encode_item(qwen, image, hash=1)], INVALID,
         "items[1]: hash 0000000000000001 is not the identity's first 8 bytes"),
        ("zero tokens", [encode_item(qwen, image, token_count=0)], INVALID,
         "items[0]: token_count must be > 0"),
        # A VIDEO item is a frame group, identified by its packed frames: an image's
        # identity sent as one is not that group's.
        ("video", [encode_item(qwen, image, modality=common_pb2.VIDEO)], INVALID,
         "items[0]: identity"),
        ("audio", [encode_item(qwen, image, modality=common_pb2.AUDIO)], INVALID,
         "items[0]: modality AUDIO is not supported"),
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


async def test_an_identity_that_is_not_the_images_own_is_refused(qwen, stack_factory):
    """The attack of issue 20 at the encoder: image X sent under image Y's identity. It is
    refused before any work, and nothing is stored under Y's key."""
    stack = await stack_factory(qwen)
    victim, attacker = png(54, 96, 96), png(55, 96, 96)
    forged = encode_item(qwen, attacker, identity=image_identity(victim, qwen.fingerprint))
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await stack.encode([encode_item(qwen, victim), forged])
    assert refused.value.code() == INVALID
    assert "items[1]: identity" in refused.value.details()
    assert "is not the identity of the image bytes sent" in refused.value.details()
    assert stack.runner.calls == []
    key = image_identity(victim, qwen.fingerprint)
    token_count = forged.item.token_count
    stored = await stack.cache_client.get_many([(key, token_count)], 64, torch.float32)
    assert stored[key] is None


async def test_the_salt_that_went_into_the_identity_must_come_with_it(qwen, stack_factory):
    stack = await stack_factory(qwen)
    image, salt = png(56, 96, 96), bytes(range(32))
    salted = encode_item(qwen, image, identity=image_identity(image, qwen.fingerprint, salt))
    # Without its salt, a salted identity is not the image's: refused.
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await stack.encode([salted])
    assert refused.value.code() == INVALID and "identity" in refused.value.details()
    # The unsalted identity under a salt is refused as well.
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await stack.stub.Encode(stack.request([encode_item(qwen, image)], identity_salt=salt))
    assert refused.value.code() == INVALID
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await stack.stub.Encode(stack.request([salted], identity_salt=b"short"))
    assert "identity_salt is 5 bytes, expected 0 or 32" in refused.value.details()
    reply = await stack.stub.Encode(stack.request([salted], identity_salt=salt))
    assert reply.results[0].ok and reply.results[0].key == salted.item.identity
