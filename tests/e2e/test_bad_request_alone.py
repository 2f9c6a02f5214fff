"""One bad request fails alone, through the whole platform (tiny Qwen2-VL, real processes,
the official openai client): an image whose cached embedding holds NaN values (as a broken
encoder would store it) fails its own request with a clean 500, while requests sent beside
it get the answers they get on their own, token for token (greedy).

Whether the poisoned request shares a step with the others depends on arrival; the engine
test (tests/llm_svc/test_bad_request_alone.py) pins that case down.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import openai
import pytest
import torch

from embedding_cache_svc.client import CacheClient
from iris.models import load_adapter
from iris.multimodal import image_identity, read_image_header
from tests.e2e.helpers import image_message, image_png

MAX_TOKENS = 6


def _answer(client, model: str, messages):
    reply = client.chat.completions.create(
        model=model, messages=messages, max_tokens=MAX_TOKENS, temperature=0
    )
    return reply.choices[0].message.content, reply.choices[0].finish_reason


def _poison(platform, png: bytes) -> None:
    """Store a NaN-holding embedding for `png` in the platform's cache, under the key the
    gateway will compute for it."""
    adapter = load_adapter(platform.model_dir)
    header = read_image_header(png)
    count, _ = adapter.image_token_count(header.width, header.height)
    embedding = torch.randn(count, adapter.hidden_size)
    embedding[1, :4] = float("nan")
    key = image_identity(png, adapter.fingerprint)
    client = CacheClient(platform.cache_address, adapter.fingerprint)
    try:
        client.put(key, embedding, count)
    finally:
        client.close()


@pytest.mark.slow
def test_an_image_with_a_nan_embedding_fails_alone_and_the_others_answer_as_alone(platform):
    client = platform.openai_client(max_retries=0, timeout=120)
    clean = {
        "text a": [{"role": "user", "content": "Tell me about rivers."}],
        "text b": [{"role": "user", "content": "Tell me about bridges."}],
        "image a": image_message(image_png(901), "What is here?"),
        "image b": image_message(image_png(902), "Describe it."),
    }
    model = platform.model_name
    alone = {name: _answer(client, model, messages) for name, messages in clean.items()}
    poisoned_png = image_png(903)
    _poison(platform, poisoned_png)
    with ThreadPoolExecutor(len(clean) + 1) as pool:
        poisoned = pool.submit(_answer, client, model, image_message(poisoned_png, "And this?"))
        together = {name: pool.submit(_answer, client, model, m) for name, m in clean.items()}
        with pytest.raises(openai.InternalServerError) as caught:
            poisoned.result()
        answers = {name: future.result() for name, future in together.items()}
    assert answers == alone
    error = caught.value.body
    assert caught.value.status_code == 500 and error["type"] == "internal_error", error
    assert "NaN or infinite" in error["message"] and "items[0]" in error["message"], error
    assert _answer(client, model, clean["text a"]) == alone["text a"]  # the pod serves on
