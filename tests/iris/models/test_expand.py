"""Prompt expansion: the ids the HF processors produce, and spans over exactly the image
tokens, in embedding-row order."""

from __future__ import annotations

import pytest
from PIL import Image

from iris.models import load_adapter
from iris.multimodal import Modality, MultimodalItem, pad_with_offsets

MESSAGES = [
    {"role": "system", "content": "Be brief."},
    {
        "role": "user",
        "content": [
            {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
            {"type": "text", "text": "Compare this"},
            {"type": "image_url", "image_url": {"url": "https://example.invalid/x.png"}},
            {"type": "text", "text": "with that."},
        ],
    },
]


@pytest.fixture(scope="module")
def qwen(tiny_qwen2_vl_dir):
    return load_adapter(tiny_qwen2_vl_dir)


@pytest.fixture(scope="module")
def idefics(tiny_idefics3_dir):
    return load_adapter(tiny_idefics3_dir)


def test_qwen_expansion_matches_processor_rule(qwen):
    # Qwen2VLProcessor (torchvision) cannot be built: its rule is to repeat <|image_pad|>
    # token_count times in the text, then tokenize. Do exactly that and compare.
    prompt = qwen.apply_chat_template(MESSAGES)
    sizes = [(640, 480), (33, 900)]
    counts, grids = zip(*(qwen.image_token_count(w, h) for w, h in sizes), strict=True)
    pieces = prompt.split(qwen.image_token)
    assert len(pieces) == 3
    text = (
        pieces[0]
        + qwen.image_token * counts[0]
        + pieces[1]
        + qwen.image_token * counts[1]
        + pieces[2]
    )
    expected = qwen.encode_prompt(text)
    ids, spans = qwen.expand_prompt(qwen.encode_prompt(prompt), list(grids))
    assert ids == expected
    image_positions = [i for i, t in enumerate(ids) if t == qwen.image_token_id]
    assert [p for span in spans for (s, e) in span for p in range(s, e + 1)] == image_positions
    assert [sum(e - s + 1 for s, e in span) for span in spans] == list(counts)
    for ((start, end),) in spans:
        assert ids[start - 1] == qwen.vision_start_token_id
        assert ids[end + 1] == qwen.vision_end_token_id


def test_qwen_bare_placeholder_gets_start_and_end(qwen):
    bare = [5, qwen.image_token_id, 6]
    ids, spans = qwen.expand_prompt(bare, [(1, 2, 4)])
    assert ids == [
        5,
        qwen.vision_start_token_id,
        *[qwen.image_token_id] * 2,
        qwen.vision_end_token_id,
        6,
    ]
    assert spans == [[(2, 3)]]


@pytest.mark.parametrize("adapter_name", ["qwen", "idefics"])
def test_placeholder_count_must_equal_grids(adapter_name, request):
    adapter = request.getfixturevalue(adapter_name)
    ids = adapter.encode_prompt(adapter.apply_chat_template(MESSAGES))
    grid = adapter.image_token_count(64, 64)[1]
    with pytest.raises(ValueError, match="2 image placeholder.*but 1 grid"):
        adapter.expand_prompt(ids, [grid])
    with pytest.raises(ValueError, match="2 image placeholder.*but 3 grid"):
        adapter.expand_prompt(ids, [grid] * 3)


IMAGE_SETS = [
    [(40, 30)],  # one unsplit image
    [(300, 120)],  # split into tiles + global
    [(300, 120), (20, 30), (64, 500)],  # several, mixed
]


def _assert_matches_idefics_processor(adapter, sizes):
    from transformers import Idefics3Processor

    processor = Idefics3Processor.from_pretrained(str(adapter.model_dir))
    content = [{"type": "image"} for _ in sizes] + [{"type": "text", "text": "What is shown?"}]
    prompt = adapter.apply_chat_template([{"role": "user", "content": content}])
    images = [Image.new("RGB", size, (100, 150, 200)) for size in sizes]
    expected = processor(text=[prompt], images=[images])["input_ids"][0]
    grids = [adapter.image_token_count(*size)[1] for size in sizes]
    ids, spans = adapter.expand_prompt(adapter.encode_prompt(prompt), grids)
    assert ids == list(expected)
    image_positions = [i for i, t in enumerate(ids) if t == adapter.image_token_id]
    assert [p for span in spans for (s, e) in span for p in range(s, e + 1)] == image_positions
    for size, span in zip(sizes, spans, strict=True):
        assert sum(e - s + 1 for s, e in span) == adapter.image_token_count(*size)[0]


@pytest.mark.parametrize("sizes", IMAGE_SETS, ids=["single", "split", "several"])
def test_idefics_expansion_matches_idefics3_processor(idefics, sizes):
    _assert_matches_idefics_processor(idefics, sizes)


def test_spans_feed_pad_with_offsets(idefics):
    prompt = idefics.apply_chat_template(MESSAGES)
    grids = [idefics.image_token_count(300, 120)[1], idefics.image_token_count(10, 10)[1]]
    ids, spans = idefics.expand_prompt(idefics.encode_prompt(prompt), grids)
    items = []
    for index, span in enumerate(spans):
        item = MultimodalItem(Modality.IMAGE)
        item.set_identity(bytes([index + 1]) * 32)
        item.offsets = span
        items.append(item)
    padded = pad_with_offsets(ids, items)
    assert len(padded) == len(ids)
    assert not any(t == idefics.image_token_id for t in padded)


def test_chat_template_renders_placeholders(qwen, idefics):
    assert qwen.apply_chat_template(MESSAGES).count(qwen.image_placeholder_text) == 2
    prompt = idefics.apply_chat_template(MESSAGES, add_generation_prompt=True)
    assert prompt.count("<image>") == 2 and prompt.endswith("Assistant:")


def test_chat_template_refuses_spelled_out_placeholder(idefics):
    messages = [{"role": "user", "content": "look: <image>"}]
    with pytest.raises(ValueError, match=r"1 image placeholder\(s\) '<image>' for 0 image"):
        idefics.apply_chat_template(messages)


def test_chat_template_rejects_unknown_part(qwen):
    messages = [{"role": "user", "content": [{"type": "input_audio", "input_audio": {}}]}]
    with pytest.raises(ValueError, match="unsupported content part type 'input_audio'"):
        qwen.apply_chat_template(messages)
