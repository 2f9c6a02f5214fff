"""Gemma 4 video against HF transformers (float32), given the frames Iris chose: Iris
samples on its own time grid (one frame a second, one frame a group) where the processor
takes 32 frames spread over the clip, so the parity is for those frames. Gemma 4's video
processor needs torchvision, which does not import here: `pixel_values_videos` and its
positions are built by the runner, the per-frame count comes from the processor's
`get_aspect_ratio_preserving_size` and the prompt text from the processor's own
`replace_video_token` (its "mm:ss" timestamps)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from gateway.intake.videos import describe_video
from iris.multimodal import Modality, MultimodalItem, image_identity, pad_with_offsets
from iris.multimodal.video import VideoLimits, sample_video
from llm_svc.engine import EngineConfig, LLMEngine
from tests.fixtures.videos import encode_video, source_frames
from tests.llm_svc.conftest import greedy
from tests.llm_svc.mm_reference import image_key_bytes, make_image, same_tokens
from tests.llm_svc.test_video_parity import MemorySource

MAX_NEW = 6


@pytest.fixture(scope="module", params=["gemma4_reference", "gemma4_e_reference"])
def parts(request):
    """Each tiny Gemma 4: frames both ways on sliding layers, or (the E shape) causal, with
    the per-layer table read at the pad id on frame rows."""
    ref = request.getfixturevalue(request.param)
    return ref, ref.adapter, ref.adapter.vision_runner()


def _video(adapter, seed: int, seconds: int = 3):
    """`seconds` s of 4 fps source frames: one sampled frame a second."""
    data = encode_video(source_frames(4 * seconds, width=80, height=48, seed=seed), fps=4)
    return sample_video(data, VideoLimits(), adapter.video_sampling)


def _request(adapter, runner, content, images, video):
    """(expanded ids, padded ids, items, embeddings by key, HF inputs, the video's groups)."""
    ids = adapter.chat_prompt_ids([{"role": "user", "content": content}])
    image_items = []
    for image in images:
        count, grid = adapter.image_token_count(image.width, image.height)
        item = MultimodalItem(Modality.IMAGE, token_count=count, grid=tuple(grid))
        item.set_identity(image_identity(image_key_bytes(image), adapter.fingerprint))
        image_items.append(item)
    groups = describe_video(video, adapter=adapter, fingerprint=adapter.fingerprint, salt=None)
    expanded, image_spans, video_spans = adapter.expand_media(
        ids, [item.grid for item in image_items], [(groups.timestamps, groups.items[0].grid)]
    )
    for item, spans in zip(image_items, image_spans, strict=True):
        item.offsets = list(spans)
    for item, span in zip(groups.items, video_spans[0], strict=True):
        item.offsets = [span]
    items = sorted(image_items + groups.items, key=lambda item: item.offsets[0][0])
    frames = [runner.preprocess_video_group(video.group_frames(g)) for g in range(video.num_groups)]
    embeddings = {
        item.key: runner.encode([p])[0] for item, p in zip(groups.items, frames, strict=True)
    }
    prepared = [runner.preprocess(image) for image in images]
    embeddings |= {
        item.key: r for item, r in zip(image_items, runner.encode(prepared), strict=True)
    }
    hf = {
        "pixel_values_videos": torch.cat([p.pixel_values for p in frames]),
        "video_position_ids": torch.cat([p.extra["positions"] for p in frames]),
        "num_frames_per_video": torch.tensor([len(frames)]),
    }
    if images:
        hf["pixel_values"] = torch.cat([p.pixel_values for p in prepared])
        hf["image_position_ids"] = torch.cat([p.extra["positions"] for p in prepared])
    padded = pad_with_offsets(expanded, items).tolist()
    return expanded, padded, items, embeddings, hf, groups


def _engine_greedy(model_dir, requests) -> list[list[int]]:
    embeddings = {key: rows for request in requests for key, rows in request[3].items()}
    config = EngineConfig(
        model_dir, page_size=4, max_num_batched_tokens=512, num_pages=512, max_num_seqs=4,
        device="cpu", dtype="float32", cache_address=None,
    )  # fmt: skip
    engine = LLMEngine(config, embedding_source=MemorySource(embeddings))
    for index, (_, padded, items, *_) in enumerate(requests):
        engine.add_request(f"r{index}", padded, greedy(MAX_NEW), items=items)
    tokens: dict[str, list[int]] = {f"r{i}": [] for i in range(len(requests))}
    while engine.has_unfinished():
        for out in engine.step():
            tokens[out.request_id].extend(out.new_token_ids)
    engine.close()
    return [tokens[f"r{i}"] for i in range(len(requests))]


def _hf_greedy(ref, expanded, video_inputs) -> list[int]:
    """HF's greedy tokens; the images' tensors are in `video_inputs` too (built by Iris's
    runner for the same images, which equal the PIL processor's: test_gemma4_vlm.py)."""
    from tests.llm_svc.mm_reference import MMPrompt

    return ref.greedy(MMPrompt(expanded, [], expanded), MAX_NEW, video_inputs)


def test_video_alone_and_with_images_equal_hf(parts):
    ref, adapter, runner = parts
    alone = _request(
        adapter, runner,
        [{"type": "text", "text": "Watch"}, {"type": "video"}, {"type": "text", "text": "now"}],
        [], _video(adapter, seed=1),
    )  # fmt: skip
    mixed = _request(
        adapter, runner,
        [{"type": "image"}, {"type": "text", "text": "then"}, {"type": "video"},
         {"type": "text", "text": "and"}, {"type": "image"}],
        [make_image(3, (70, 50)), make_image(4, (40, 96))], _video(adapter, seed=2),
    )  # fmt: skip
    assert sum(item.modality == Modality.VIDEO for item in mixed[2]) == 3
    got = _engine_greedy(ref.model_dir, [alone, mixed])
    for request, tokens in zip([alone, mixed], got, strict=True):
        assert same_tokens(tokens, _hf_greedy(ref, request[0], request[4]))


def test_the_layout_is_the_processors(parts):
    """Counts from the processor's arithmetic at the video budget; the text from its own
    replace_video_token, given Iris's timestamps."""
    from transformers.models.gemma4.image_processing_pil_gemma4 import (
        get_aspect_ratio_preserving_size,
    )
    from transformers.models.gemma4.processing_gemma4 import Gemma4Processor

    _, adapter, _ = parts
    video = _video(adapter, seed=3, seconds=62)  # past a minute: "01:00" ...
    groups = describe_video(video, adapter=adapter, fingerprint=adapter.fingerprint, salt=None)
    ids = adapter.chat_prompt_ids([{"role": "user", "content": [{"type": "video"}]}])
    expanded, _, _ = adapter.expand_media(ids, [], [(groups.timestamps, groups.items[0].grid)])
    items = groups.items
    rule = adapter.video_rule
    height, width = get_aspect_ratio_preserving_size(
        height=48, width=80, patch_size=rule.patch_size,
        max_patches=rule.max_soft_tokens * rule.pooling_kernel_size**2,
        pooling_kernel_size=rule.pooling_kernel_size,
    )  # fmt: skip
    count = (height // rule.patch_size) * (width // rule.patch_size) // rule.pooling_kernel_size**2
    assert (video.width, video.height) == (width, height)
    assert all(item.token_count == count for item in items) and len(items) == 62
    fake = SimpleNamespace(boi_token="<|image>", eoi_token="<image|>", video_token="<|video|>")
    metadata = SimpleNamespace(fps=1.0, timestamps=groups.timestamps)
    inputs = {"num_soft_tokens_per_video": [count], "video_metadata": [metadata]}
    text = Gemma4Processor.replace_video_token(fake, inputs, 0)
    assert "00:59 <|image>" in text and "01:01 <|image>" in text
    tokenizer = adapter.tokenizer()
    rendered = tokenizer.decode(ids)
    want = tokenizer(rendered.replace("<|video|>", text), add_special_tokens=False)
    assert expanded == want["input_ids"]
