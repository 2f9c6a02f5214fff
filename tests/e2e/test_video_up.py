"""Video under `iris up` on tiny Qwen3-VL (real cache, encoder, pod and gateway processes):
each frame group is an item, so the same clip sent again encodes no group, and a clip that
shares 75 % of its aligned groups with an earlier one encodes only the other 25 %. The
answers equal those of the same requests under another cache_salt, where nothing is shared
(every identity is salted) and every group is encoded afresh. Two requests for one clip at
once encode it once; a still clip's identical groups are encoded once; a request's groups
go to the encoder in Encode messages of at most `max_encode_items`.

Both clips are cut from the same source frames with FFV1 (intra-only, lossless), so their
shared moments decode to bit-identical frames."""

from __future__ import annotations

import base64
from concurrent.futures import ThreadPoolExecutor

import pytest

from iris.up.metrics_page import metrics_url, scrape
from tests.fixtures.videos import encode_video, source_frames

pytestmark = pytest.mark.slow

FPS = 4  # source frames per second; Iris samples 2 per second: 2 frames = one group = 1 s


def _video_message(data: bytes, text: str) -> list[dict]:
    url = "data:video/x-matroska;base64," + base64.b64encode(data).decode()
    return [
        {
            "role": "user",
            "content": [
                {"type": "video_url", "video_url": {"url": url}},
                {"type": "text", "text": text},
            ],
        }
    ]


def test_frame_groups_are_encoded_once_across_requests_and_clips(platform_qwen3_vl):
    # The session's tiny Qwen3-VL platform (float32 embeddings; a clip's 8 groups go to the
    # encoder as Encode messages of 3, 3 and 2), shared: what is encoded is counted from here.
    platform = platform_qwen3_vl
    source = source_frames(40, width=64, height=32, seed=48)
    first = encode_video(source[:32], fps=FPS)  # 8 s: 8 groups
    second = encode_video(source[8:40], fps=FPS)  # from 2 s: its groups 0-5 are first's 2-7
    client = platform.openai_client()

    def chat(data: bytes, salt: str | None = None) -> str:
        extra = {"cache_salt": salt} if salt else {}
        reply = client.chat.completions.create(
            model=platform.model_name,
            messages=_video_message(data, "What happens?"),
            max_tokens=6,
            temperature=0,
            extra_body=extra,
        )
        assert reply.usage.prompt_tokens > 8 * 8, reply.usage  # 8 groups of >= 8 tokens
        return reply.choices[0].message.content

    def encoder_page(labels: dict | None = None) -> dict[str, float]:
        return scrape(metrics_url(platform.by_kind("encoder")[0]), labels)

    def batch_counts() -> tuple[float, float]:
        """(tower batches, those of at most 4 images) so far."""
        small = encoder_page({"le": "4.0"}).get("iris_encoder_batch_size_images_bucket", 0)
        return encoder_page().get("iris_encoder_batch_size_images_count", 0), small

    encoded_before = encoder_page().get("iris_encoder_images_total", 0)
    batches_before, small_before = batch_counts()

    def encoded() -> int:  # by this test
        return int(encoder_page().get("iris_encoder_images_total", 0) - encoded_before)

    answer_first = chat(first)
    assert encoded() == 8
    assert chat(first) == answer_first
    assert encoded() == 8  # the same clip again: no group encoded
    answer_second = chat(second)
    assert encoded() == 8 + 2  # 6 of its 8 groups were the first clip's
    # Nothing shared under another salt: all 8 groups encoded, the same answers.
    assert chat(second, salt="alone") == answer_second
    assert encoded() == 8 + 2 + 8
    assert chat(first, salt="alone") == answer_first
    assert encoded() == 8 + 2 + 8 + 2
    # Two requests for a new clip at once: its groups are encoded once (the second
    # request finds them reserved or present, as for images).
    third = encode_video(source[2:34], fps=FPS)  # from 0.5 s: off the others' 1 s grid
    with ThreadPoolExecutor(2) as pool:
        answers = list(pool.map(chat, [third, third]))
    assert answers[0] == answers[1]
    assert encoded() == 8 + 2 + 8 + 2 + 8
    # A still clip: its 3 groups are one item's identity, encoded once.
    still = encode_video(source[[0] * 12], fps=FPS)
    chat(still)
    assert encoded() == 8 + 2 + 8 + 2 + 8 + 1
    # Sent in turn, no Encode message held more than 3 groups: no tower batch did.
    batches, small = batch_counts()
    assert small - small_before == batches - batches_before > 0
