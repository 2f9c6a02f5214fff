"""Embedding dtype is part of the contract, not a cache miss (docs/design/multimodal.md): an encoder
that stores bfloat16 embeddings (as one on a GPU does) serves a float32 pod, and a float32
encoder a bfloat16 pod, by converting on read — the request is answered on its first try,
with no "embedding missing" retry and no entry discarded. Real processes throughout."""

from __future__ import annotations

import httpx
import pytest

from iris.up.metrics_page import metrics_url, scrape
from tests.e2e.helpers import image_message, image_png
from tests.fixtures.platform import start_platform

pytestmark = pytest.mark.slow


@pytest.mark.parametrize(
    ("encoder_dtype", "pod_dtype"), [("bfloat16", "float32"), ("float32", "bfloat16")]
)
def test_an_embedding_in_another_dtype_is_converted_on_read(
    tmp_path, tiny_qwen2_vl_dir, encoder_dtype, pod_dtype
):
    platform = start_platform(
        tiny_qwen2_vl_dir,
        tmp_path,
        extra_env={
            "encoder": {"IRIS_ENCODER_EMBEDDING_DTYPE": encoder_dtype},
            "llm": {"IRIS_LLM_DTYPE": pod_dtype},
        },
    )
    try:
        body = {
            "model": platform.model_name,
            "messages": image_message(image_png(seed=7000)),
            "max_tokens": 4,
            "temperature": 0,
        }
        url = f"{platform.gateway_url}/v1/chat/completions"
        for _ in range(2):  # the second is served from the stored entry or the prefix
            reply = httpx.post(url, json=body, timeout=90)
            assert reply.status_code == 200, reply.text
        assert (
            scrape(metrics_url(platform.service("gateway"))).get("iris_gateway_retries_total", 0)
            == 0
        )
        cache = scrape(metrics_url(platform.service("cache")))
        assert cache.get("iris_cache_validation_discards_total", 0) == 0, cache
        assert cache.get("iris_cache_hits_total", 0) >= 1, cache  # the pod read the entry
    finally:
        platform.stop()
