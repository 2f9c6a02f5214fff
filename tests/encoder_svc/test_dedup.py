"""Concurrent callers with duplicates: one tower call per batch, one encoding per image."""

from __future__ import annotations

import asyncio

import torch

from iris.metrics import ENCODER_BATCH_SIZE, ENCODER_DEDUP_RATIO
from iris.multimodal import decode_image
from tests.encoder_svc.stack import encode_item, png

SIZES = [(200, 120), (96, 96), (150, 260), (320, 64), (120, 200), (64, 64)]
CALLERS = 8
ITEMS_PER_CALLER = 4


def _sample(registry, name: str) -> float:
    return registry.get_sample_value(name) or 0.0


async def test_concurrent_duplicates_encode_each_image_once(qwen, stack_factory):
    unique = len(SIZES)
    stack = await stack_factory(qwen, max_batch_images=unique, max_wait_ms=2000)
    images = [png(seed, w, h) for seed, (w, h) in enumerate(SIZES)]
    # Every caller asks for 4 images out of 6; every image is asked for several times.
    per_caller = [
        [encode_item(qwen, images[(caller + 2 * j) % unique]) for j in range(ITEMS_PER_CALLER)]
        for caller in range(CALLERS)
    ]
    replies = await asyncio.gather(*(stack.encode(items) for items in per_caller))
    for items, reply in zip(per_caller, replies, strict=True):
        assert [r.ok for r in reply.results] == [True] * ITEMS_PER_CALLER
        assert [r.key for r in reply.results] == [item.item.identity for item in items]

    calls = stack.runner.calls
    registry = stack.encoder.metrics.registry
    assert sum(calls) == unique  # each distinct image went through the tower once
    assert len(calls) < unique  # ...and they shared tower calls
    assert _sample(registry, ENCODER_BATCH_SIZE + "_count") == len(calls)
    assert _sample(registry, ENCODER_BATCH_SIZE + "_sum") == unique

    # Each stored embedding is that image's own, equal to encoding it alone.
    runner = qwen.runner
    for image in images:
        item = encode_item(qwen, image).item
        stored = await stack.cache_client.get_many(
            [(item.identity, item.token_count)], runner.hidden_size, torch.float32
        )
        alone = runner.encode([runner.preprocess(decode_image(image))])[0]
        torch.testing.assert_close(stored[item.identity], alone, atol=1e-5, rtol=1e-4)

    # A second wave finds everything in the cache: no tower call at all.
    again = await asyncio.gather(*(stack.encode(items) for items in per_caller))
    assert all(r.ok for reply in again for r in reply.results)
    assert sum(calls) == unique
    submitted = 2 * CALLERS * ITEMS_PER_CALLER
    expected_ratio = (submitted - unique) / submitted
    assert _sample(registry, ENCODER_DEDUP_RATIO) == expected_ratio


async def test_duplicates_inside_one_request_share_one_encoding(qwen, stack_factory):
    stack = await stack_factory(qwen)
    image = png(7, 128, 96)
    reply = await stack.encode([encode_item(qwen, image)] * 3)
    assert [r.ok for r in reply.results] == [True, True, True]
    assert stack.runner.calls == [1]


async def test_a_batch_with_nothing_left_to_wait_for_does_not_wait_out_its_window(
    qwen, stack_factory
):
    """With a 10-minute window, a lone request still comes back: once no other admitted
    image is being claimed or prepared, the batch closes (the test's timeout is far below
    the window, far above an encode)."""
    stack = await stack_factory(qwen, max_wait_ms=600_000)
    items = [encode_item(qwen, png(seed, 128, 96)) for seed in (81, 82)]
    reply = await asyncio.wait_for(stack.encode(items), timeout=120)
    assert [r.ok for r in reply.results] == [True, True]
    assert stack.runner.calls == [2]  # both images of the request in one call
