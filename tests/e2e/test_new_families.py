"""`iris up` with the tiny checkpoints of the tiled and row-broken VLM families: an image
chat through gateway, encoder, cache and pod processes, then the same image again, which
is served from the pod's prefix cache and the embedding cache (encoded once)."""

from __future__ import annotations

import pytest

from iris.up.processes import wait_until
from tests.e2e.helpers import image_message, image_png
from tests.e2e.test_chat import encoded_images
from tests.fixtures.platform import start_platform

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("fixture", ["tiny_internvl_dir", "tiny_mistral3_dir"])
def test_image_chat_then_the_same_image_from_the_cache(fixture, request, tmp_path):
    running = start_platform(request.getfixturevalue(fixture), tmp_path)
    try:
        client = running.openai_client()
        png = image_png(seed=52, size=(150, 64))
        replies = [
            client.chat.completions.create(
                model=running.model_name,
                messages=image_message(png),
                max_tokens=4,
                temperature=0,
            )
            for _ in range(2)
        ]
        first, second = replies
        assert first.usage.prompt_tokens > 40  # the image's tokens are in the prompt
        assert second.choices[0].message.content == first.choices[0].message.content
        assert wait_until(lambda: encoded_images(running) >= 1, 10)
        assert encoded_images(running) == 1
        # The whole prompt but its last page comes from the pod's prefix cache.
        cached = second.usage.prompt_tokens_details.cached_tokens
        assert cached >= second.usage.prompt_tokens - 16, (cached, second.usage)
    finally:
        running.stop()
