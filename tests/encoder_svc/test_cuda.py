"""On CUDA the tower runs in bfloat16 and stores bfloat16 embeddings (skipped without a GPU)."""

from __future__ import annotations

import pytest
import torch

from tests.encoder_svc.stack import Family, encode_item, png, start_stack

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


async def test_cuda_bf16_embeddings_match_the_cpu_ones(qwen):
    gpu_runner = qwen.adapter.vision_runner(device="cuda", dtype=torch.bfloat16)
    family = Family(qwen.name, qwen.model_dir, qwen.adapter, gpu_runner)
    stack = await start_stack(family, device="cuda", max_wait_ms=20)
    try:
        items = [encode_item(family, png(seed, 200, 120)) for seed in (91, 92, 93)]
        reply = await stack.encode(items)
        assert all(r.ok for r in reply.results)
        assert sum(stack.runner.calls) == 3
        for item in items:
            key = (item.item.identity, item.item.token_count)
            stored = (await stack.cache_client.get_many([key], 64, torch.bfloat16))[key[0]]
            assert stored.dtype == torch.bfloat16 and stored.device.type == "cpu"
            cpu = (await _cpu_reference(qwen, item.image)).to(torch.float32)
            torch.testing.assert_close(stored.to(torch.float32), cpu, atol=5e-2, rtol=5e-2)
    finally:
        await stack.close()


async def _cpu_reference(family: Family, image: bytes) -> torch.Tensor:
    from iris.multimodal import decode_image

    runner = family.runner
    return runner.encode([runner.preprocess(decode_image(image))])[0]
