"""Video against HF transformers' `generate` in float32: the prompt Iris builds (each frame
group an item with its own span, `ModelAdapter.expand_media`), each group encoded alone by
Iris's vision runner and read by the engine like an image, give the same greedy tokens as
HF's model given the `pixel_values_videos` and `video_grid_thw` Iris built (HF's video
processor needs torchvision, which does not import here) — for a video alone and for two
images and a video in one request, on tiny Qwen3-VL, Qwen2.5-VL and Qwen3.5 (which takes
Qwen3-VL's video processor and splits `video_grid_thw` per group as Qwen3-VL does).

HF encodes a video whole; Iris each group alone (the tower attends within one temporal
group), and places the groups by its own position rule: Qwen3-VL's timestamps are in the
text, Qwen2.5-VL's absolute time is in M-RoPE's temporal row."""

from __future__ import annotations

import pytest
import torch

from gateway.intake.videos import describe_video
from iris.models import load_adapter
from iris.multimodal import Modality, MultimodalItem, image_identity, pad_with_offsets
from iris.multimodal.video import VideoLimits, sample_video
from llm_svc.engine import EngineConfig, LLMEngine
from llm_svc.engine.embeddings import EmbeddingSource
from tests.fixtures.videos import encode_video, source_frames
from tests.llm_svc.conftest import greedy
from tests.llm_svc.mm_reference import image_key_bytes, make_image

MAX_NEW = 6
TIE_MARGIN = 2e-4


class MemorySource(EmbeddingSource):
    """The embeddings an encoder would store, from memory (the cache is not under test)."""

    def __init__(self, embeddings: dict[bytes, torch.Tensor]) -> None:
        self.embeddings = embeddings

    def fetch(self, items, hidden, dtype):
        return {index: self.embeddings[item.key].to(dtype) for index, item in items.items()}


@pytest.fixture(
    scope="module", params=["tiny_qwen3_vl_dir", "tiny_qwen2_5_vl_dir", "tiny_qwen3_5_vl_dir"]
)
def model_dir(request):
    return request.getfixturevalue(request.param)


@pytest.fixture(scope="module")
def adapter(model_dir):
    return load_adapter(model_dir)


@pytest.fixture(scope="module")
def hf_model(model_dir):
    from transformers import AutoModelForImageTextToText

    return AutoModelForImageTextToText.from_pretrained(str(model_dir), dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def runner(adapter):
    return adapter.vision_runner()


def _video(adapter, seed: int):
    """3 s of 4 fps source frames: 6 sampled frames, 3 groups."""
    data = encode_video(source_frames(12, width=80, height=48, seed=seed), fps=4)
    return sample_video(data, VideoLimits(), adapter.video_sampling)


def _request(adapter, runner, content: list[dict], images, video):
    """(expanded ids, padded ids, items in token order, embeddings by key, HF inputs)."""
    fingerprint = adapter.fingerprint
    ids = adapter.chat_prompt_ids([{"role": "user", "content": content}])
    image_items = []
    for image in images:
        count, grid = adapter.image_token_count(image.width, image.height)
        item = MultimodalItem(Modality.IMAGE, token_count=count, grid=tuple(grid))
        item.set_identity(image_identity(image_key_bytes(image), fingerprint))
        image_items.append(item)
    groups = describe_video(video, adapter=adapter, fingerprint=fingerprint, salt=None)
    expanded, image_spans, video_spans = adapter.expand_media(
        ids, [item.grid for item in image_items], [(groups.timestamps, groups.items[0].grid)]
    )
    for item, spans in zip(image_items, image_spans, strict=True):
        item.offsets = list(spans)
    for item, span in zip(groups.items, video_spans[0], strict=True):
        item.offsets = [span]
    items = sorted(image_items + groups.items, key=lambda item: item.offsets[0][0])
    padded = pad_with_offsets(expanded, items).tolist()

    embeddings = {}
    prepared_images = [runner.preprocess(image) for image in images]
    for item, rows in zip(image_items, runner.encode(prepared_images), strict=True):
        embeddings[item.key] = rows
    prepared_groups = [
        runner.preprocess_video_group(video.group_frames(g)) for g in range(video.num_groups)
    ]
    for prepared, item in zip(prepared_groups, groups.items, strict=True):
        embeddings[item.key] = runner.encode([prepared])[0]  # each group alone

    ids_tensor = torch.tensor([expanded])
    types = (ids_tensor == adapter.image_token_id).int()
    types += 2 * (ids_tensor == adapter.video_token_id).int()
    _, h, w = prepared_groups[0].grid
    hf = {
        "pixel_values_videos": torch.cat([p.pixel_values for p in prepared_groups]),
        "video_grid_thw": torch.tensor([[video.num_groups, h, w]]),
        "mm_token_type_ids": types,
    }
    if adapter.config["model_type"] == "qwen2_5_vl":
        # The processor's seconds per temporal grid step: temporal_patch_size / fps.
        sampling = adapter.video_sampling
        hf["second_per_grid_ts"] = torch.tensor([sampling.temporal_patch_size / sampling.fps])
    if images:
        hf["pixel_values"] = torch.cat([p.pixel_values for p in prepared_images])
        hf["image_grid_thw"] = torch.tensor([p.grid for p in prepared_images])
    return expanded, padded, items, embeddings, hf


def _hf_greedy(hf_model, expanded: list[int], inputs: dict, eos: set[int]) -> list[int]:
    """HF's greedy tokens, cut before a near-tie (random tiny weights make some) and before
    a step whose raw argmax is an EOS (HF's min_new_tokens masks it; the engine, ignoring
    EOS, may take it)."""
    ids = torch.tensor([expanded])
    with torch.inference_mode():
        out = hf_model.generate(
            ids, attention_mask=torch.ones_like(ids), max_new_tokens=MAX_NEW,
            min_new_tokens=MAX_NEW, do_sample=False, output_logits=True,
            return_dict_in_generate=True, **inputs,
        )  # fmt: skip
    tokens = out.sequences[0, len(expanded) :].tolist()
    for step, logits in enumerate(out.logits):
        top = logits[0].float().topk(2)
        if float(top.values[0] - top.values[1]) < TIE_MARGIN or int(top.indices[0]) in eos:
            return tokens[:step]
    return tokens


def _engine_greedy(model_dir, requests, logprobs: list | None = None) -> list[list[int]]:
    """The engine's greedy tokens per request; `logprobs`, when given, gets each request's
    first sampled token's log-probability."""
    embeddings = {key: rows for _, _, _, table, _ in requests for key, rows in table.items()}
    config = EngineConfig(
        model_dir, page_size=4, max_num_batched_tokens=512, num_pages=512, max_num_seqs=4,
        device="cpu", dtype="float32", cache_address=None,
    )  # fmt: skip
    engine = LLMEngine(config, embedding_source=MemorySource(embeddings))
    for index, (_, padded, items, _, _) in enumerate(requests):
        engine.add_request(f"r{index}", padded, greedy(MAX_NEW, logprobs=1), items=items)
    tokens: dict[str, list[int]] = {f"r{i}": [] for i in range(len(requests))}
    first: dict[str, float] = {}
    while engine.has_unfinished():
        for out in engine.step():
            tokens[out.request_id].extend(out.new_token_ids)
            if out.new_logprobs and out.request_id not in first:
                first[out.request_id] = out.new_logprobs[0].logprob
    if logprobs is not None:
        logprobs.extend(first[f"r{i}"] for i in range(len(requests)))
    return [tokens[f"r{i}"] for i in range(len(requests))]


def test_greedy_with_video_equals_hf(model_dir, adapter, hf_model, runner):
    video = _video(adapter, seed=1)
    alone = _request(
        adapter, runner,
        [{"type": "text", "text": "Watch"}, {"type": "video"}, {"type": "text", "text": "now"}],
        [], video,
    )  # fmt: skip
    mixed = _request(
        adapter, runner,
        [{"type": "image"}, {"type": "text", "text": "then"}, {"type": "video"},
         {"type": "text", "text": "and"}, {"type": "image"}, {"type": "text", "text": "so"}],
        [make_image(3), make_image(4, (64, 96))], _video(adapter, seed=2),
    )  # fmt: skip
    assert sum(item.modality == Modality.VIDEO for item in mixed[2]) == 3
    got = _engine_greedy(model_dir, [alone, mixed])
    for request, tokens in zip([alone, mixed], got, strict=True):
        expected = _hf_greedy(hf_model, request[0], request[4], set(adapter.eos_token_ids))
        assert len(expected) >= 3, "reference cut short by a near-tie: pick another prompt"
        assert tokens[: len(expected)] == expected


def test_the_video_matters(model_dir, adapter, runner):
    """Guard against a test that cannot fail: another clip changes the engine's output
    (its first token's log-probability; a tiny random model's greedy tokens may not move)."""
    content = [{"type": "text", "text": "Watch"}, {"type": "video"}]
    one = _request(adapter, runner, content, [], _video(adapter, seed=1))
    other = _request(adapter, runner, content, [], _video(adapter, seed=5))
    logprobs: list[float] = []
    _engine_greedy(model_dir, [one, other], logprobs)
    assert abs(logprobs[0] - logprobs[1]) > 1e-3, logprobs


def test_positions_equal_hf_get_rope_index(adapter, hf_model, runner):
    """Two images and a video: Iris's M-RoPE table equals HF's get_rope_index on the same
    ids (Qwen2.5-VL: each group's temporal row at its absolute time; Qwen3-VL: as images)."""
    expanded, _, items, _, hf = _request(
        adapter, runner,
        [{"type": "image"}, {"type": "video"}, {"type": "text", "text": "and"},
         {"type": "image"}],
        [make_image(3), make_image(4, (64, 96))], _video(adapter, seed=2),
    )  # fmt: skip
    positions, delta = adapter.mrope_positions(len(expanded), items)
    keys = ("image_grid_thw", "video_grid_thw", "second_per_grid_ts")
    expected, expected_delta = hf_model.model.get_rope_index(
        torch.tensor([expanded]), hf["mm_token_type_ids"], **{k: hf[k] for k in keys if k in hf}
    )
    assert (positions == expected[:, 0].numpy()).all()
    assert delta == int(expected_delta)
    if adapter.video_time_interval:  # the temporal row jumps by the interval per group
        video = [item for item in items if item.modality == Modality.VIDEO]
        starts = [int(positions[0, item.offsets[0][0]]) for item in video]
        assert starts[1] - starts[0] == int(adapter.video_time_interval) > 1


def test_each_group_alone_equals_its_rows_of_hf_whole_video(adapter, hf_model, runner):
    """The tower attends within one temporal group (Qwen2.5-VL's window attention too):
    the groups encoded one at a time equal HF's get_video_features over the whole video."""
    video = _video(adapter, seed=3)
    prepared = [runner.preprocess_video_group(video.group_frames(g)) for g in range(3)]
    ours = torch.cat([runner.encode([group])[0] for group in prepared])
    _, h, w = prepared[0].grid
    pixels = torch.cat([group.pixel_values for group in prepared])
    with torch.no_grad():
        out = hf_model.model.get_video_features(pixels, torch.tensor([[3, h, w]]))
    rows = [out.pooler_output[0] if isinstance(out.pooler_output, tuple) else out.pooler_output]
    for level in getattr(out, "deepstack_features", None) or []:
        rows.append(level[0] if isinstance(level, tuple) else level)
    expected = torch.cat(rows, dim=1) if getattr(adapter, "deepstack_levels", 0) else rows[0]
    torch.testing.assert_close(ours, expected, rtol=1e-5, atol=1e-5)
