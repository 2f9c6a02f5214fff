"""A bad image among good ones fails alone, with its reason in the cache."""

from __future__ import annotations

import torch

from embedding_cache_svc.client import Failed
from iris.metrics import ENCODER_FAILED_IMAGES, LABEL_REASON
from iris.multimodal import image_identity
from tests.encoder_svc.stack import CountingRunner, encode_item, png


async def _stored(stack, items) -> dict:
    requests = [(item.item.identity, item.item.token_count) for item in items]
    return await stack.cache_client.get_many(
        requests, stack.family.runner.hidden_size, torch.float32
    )


def _failures(stack, reason: str) -> float:
    registry = stack.encoder.metrics.registry
    return registry.get_sample_value(ENCODER_FAILED_IMAGES, {LABEL_REASON: reason})


async def test_bad_images_fail_alone_with_their_reason(qwen, stack_factory):
    stack = await stack_factory(qwen, max_wait_ms=200)
    good = [encode_item(qwen, png(seed, 128, 96)) for seed in (1, 2)]
    garbage = encode_item(qwen, png(3, 64, 64))
    garbage.image = b"this is not an image at all"
    truncated = encode_item(qwen, png(4, 128, 128))
    truncated.image = truncated.image[: len(truncated.image) // 2]
    for bad in (garbage, truncated):  # identities are of the bytes sent, as the gateway's
        bad.item.identity = image_identity(bad.image, qwen.fingerprint)
    wrong_count = encode_item(qwen, png(5, 96, 96))
    wrong_count.item.token_count += 1
    items = [good[0], garbage, truncated, good[1], wrong_count]

    reply = await stack.encode(items)
    results = {r.key: r for r in reply.results}
    assert [r.ok for r in reply.results] == [True, False, False, True, False]
    assert "cannot identify image" in results[garbage.item.identity].error
    assert "image data is corrupt" in results[truncated.item.identity].error
    count = wrong_count.item.token_count
    assert f"gives {count - 1} vision tokens, the request expected {count}" in (
        results[wrong_count.item.identity].error
    )

    stored = await _stored(stack, items)
    for item in good:
        assert isinstance(stored[item.item.identity], torch.Tensor)
    for item in (garbage, truncated, wrong_count):
        entry = stored[item.item.identity]
        assert isinstance(entry, Failed)
        assert entry.reason == results[item.item.identity].error
    assert sum(stack.runner.calls) == 2  # the failed ones never reached the tower
    assert _failures(stack, "decode") == 2
    assert _failures(stack, "token_count") == 1


class RowDroppingRunner(CountingRunner):
    """Fault injection: the tower output of images with `victim_rows` rows loses a row."""

    victim_rows = 0

    def encode(self, prepared):
        outputs = super().encode(prepared)
        return [out[:-1] if out.shape[0] == self.victim_rows else out for out in outputs]


async def test_row_count_mismatch_fails_that_item_alone(qwen, stack_factory):
    stack = await stack_factory(qwen, max_wait_ms=200)
    victim = encode_item(qwen, png(11, 96, 96))
    others = [encode_item(qwen, png(12, 200, 120)), encode_item(qwen, png(13, 64, 260))]
    dropping = RowDroppingRunner(qwen.runner)
    dropping.victim_rows = victim.item.token_count
    assert all(item.item.token_count != dropping.victim_rows for item in others)
    stack.encoder.batcher._runner = dropping  # same real runner, with the fault in front

    reply = await stack.encode([others[0], victim, others[1]])
    assert [r.ok for r in reply.results] == [True, False, True]
    rows = victim.item.token_count
    assert f"shape [{rows - 1}, 64], expected {rows} rows" in reply.results[1].error
    stored = await _stored(stack, [others[0], victim, others[1]])
    assert isinstance(stored[victim.item.identity], Failed)
    assert all(isinstance(stored[item.item.identity], torch.Tensor) for item in others)
    assert _failures(stack, "row_count") == 1
