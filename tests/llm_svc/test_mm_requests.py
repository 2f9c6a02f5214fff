"""Malformed multimodal requests are refused alone, each with a typed error naming the
value and the limit; the engine goes on serving. Assembly never pads missing rows."""

from __future__ import annotations

import copy

import pytest
import torch

from iris.multimodal import Modality, MultimodalItem
from llm_svc import LLM
from llm_svc.engine import InvalidRequestError, RequestDataError
from llm_svc.engine.embeddings import assemble_input_embeds, chunk_image_rows
from llm_svc.engine.scheduler import ScheduledChunk
from llm_svc.engine.sequence import Sequence
from tests.llm_svc.conftest import greedy, make_engine
from tests.llm_svc.mm_reference import make_image, same_tokens


@pytest.fixture(scope="module")
def qwen_llm(qwen_reference):
    return LLM(qwen_reference.model_dir, page_size=4, num_pages=128)


@pytest.fixture(scope="module")
def good(qwen_reference):
    return qwen_reference.prompt(["Describe", "please"], [make_image(7)])


def _broken(good, change):
    ids, items = list(good.padded), copy.deepcopy(good.items)
    change(ids, items)
    return ids, items


def _set(ids, index, value):
    ids[index] = value


def _second_item(items, offsets):
    item = MultimodalItem(Modality.IMAGE, offsets=offsets, token_count=2, grid=(1, 2, 4))
    item.set_hash(12345)
    items.append(item)


CASES = {
    "sentinel of another rotation slot": (
        lambda ids, items: _set(ids, items[0].offsets[0][0], items[0].pad_values[1]),
        ["prompt_token_ids[7]", "must be sentinel", "items[0]"],
    ),
    "span past the prompt": (
        lambda ids, items: setattr(items[0], "offsets", [(30, 45)]),
        ["(30, 45)", "outside the sequence [0, 35]"],
    ),
    "overlapping items": (
        lambda ids, items: _second_item(items, [(20, 21)]),
        ["overlaps"],
    ),
    "token_count not the spans' sum": (
        lambda ids, items: setattr(items[0], "token_count", 9),
        ["items[0].token_count=9", "sum 16"],
    ),
    "sentinel outside every span (more images than items)": (
        lambda ids, items: _set(ids, 2, items[0].pad_values[0]),
        ["prompt_token_ids[2]", "[0, 448)"],
    ),
    "unpadded image placeholder (more placeholders than items)": (
        lambda ids, items: _set(ids, 3, 405),
        ["prompt_token_ids[3]", "image placeholder outside", "1 item(s)"],
    ),
    "unpadded video placeholder (a frame group without an item)": (
        lambda ids, items: _set(ids, 3, 406),
        ["prompt_token_ids[3]", "video placeholder outside", "1 item(s)"],
    ),
    "item without a key": (
        lambda ids, items: items.append(MultimodalItem(Modality.IMAGE, offsets=[(30, 31)])),
        ["items[1]", "identity or a hash"],
    ),
    "grid that does not match the span": (
        lambda ids, items: setattr(items[0], "grid", (1, 4, 4)),
        ["items grid", "(1, 4, 4)", "16 tokens"],
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_malformed_request_fails_alone(qwen_llm, qwen_reference, good, case):
    change, words = CASES[case]
    ids, items = _broken(good, change)
    engine = qwen_llm.engine
    engine.add_request("bystander", good.padded, greedy(4), items=good.items)
    qwen_llm.vision.register(good.items[0].key, good.images[0])
    with pytest.raises(InvalidRequestError) as caught:
        engine.add_request("bad", ids, greedy(4), items=items)
    for word in words:
        assert word in str(caught.value), (word, str(caught.value))
    tokens = []
    while engine.has_unfinished():
        tokens += [t for out in engine.step() for t in out.new_token_ids]
    qwen_llm.vision.unregister(good.items[0].key)
    assert same_tokens(tokens, qwen_reference.greedy(good, 4))
    assert engine.blocks.num_used == 0 and not engine.requests


def test_items_on_a_text_only_model_are_refused(llama_dir, good):
    engine = make_engine(llama_dir)
    ids = [min(i, 300) for i in good.expanded]
    with pytest.raises(InvalidRequestError, match="takes no images"):
        engine.add_request("x", ids, greedy(2), items=good.items)


def test_llm_refuses_a_placeholder_count_that_differs_from_the_images(qwen_llm, good):
    with pytest.raises(InvalidRequestError, match=r"prompt 0: images.*1 image placeholder"):
        qwen_llm.generate(
            prompt_token_ids=[good.ids], images=[[make_image(1), make_image(2)]], use_tqdm=False
        )


def test_assembly_scatters_image_rows_and_never_pads(good):
    item = good.items[0]
    seq = Sequence("s", good.padded, greedy(1), items=[item])
    hidden, vocab = 8, 448
    table = torch.randn(vocab, hidden)
    embedding = torch.randn(item.token_count, hidden)
    seq.embeddings[0] = embedding
    start, end = item.offsets[0]
    # A chunk that starts inside the image span and ends after it.
    chunk = ScheduledChunk(seq, start + 3, len(good.padded) - start - 3)
    ids = torch.tensor(good.padded[chunk.start :], dtype=torch.int64)
    rows = chunk_image_rows(chunk, hidden)
    out = assemble_input_embeds(table.__getitem__, ids, [rows], [0], vocab)
    image_rows = end - chunk.start + 1
    torch.testing.assert_close(out[:image_rows], embedding[3:])
    torch.testing.assert_close(out[image_rows:], table[ids[image_rows:]])
    seq.embeddings[0] = embedding[:10]  # too few rows: the request's error, never padding
    with pytest.raises(RequestDataError, match="embedding has 10 rows"):
        chunk_image_rows(chunk, hidden)
    seq.embeddings[0] = torch.randn(item.token_count, hidden + 1)  # another model's width
    with pytest.raises(RequestDataError, match=f"must be {hidden} wide"):
        chunk_image_rows(chunk, hidden)
    text = ScheduledChunk(seq, end + 1, 3)  # no image rows: nothing to assemble
    assert chunk_image_rows(text, hidden) is None
    assert assemble_input_embeds(table.__getitem__, ids[:3], [None], [0], vocab) is None


def test_llm_refuses_undecodable_image_bytes_and_runs_nothing(qwen_llm, good):
    with pytest.raises(InvalidRequestError, match=r"prompt 1: images\[0\]=.*5 bytes"):
        qwen_llm.generate(
            prompt_token_ids=[good.ids, good.ids], images=[[make_image(1)], [b"12345"]],
            use_tqdm=False,
        )  # fmt: skip
    assert not qwen_llm.engine.has_unfinished() and qwen_llm.engine.blocks.num_used == 0


def test_chat_takes_image_parts_as_pil_bytes_or_data_url(qwen_llm):
    import base64
    import io

    from llm_svc import SamplingParams

    image = make_image(11)
    png = io.BytesIO()
    image.save(png, format="PNG")
    data_url = "data:image/png;base64," + base64.b64encode(png.getvalue()).decode()
    params = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)

    def conversation(part):
        return [{"role": "user", "content": [part, {"type": "text", "text": "What is it?"}]}]

    by_pil = qwen_llm.chat(conversation({"type": "image", "image": image}), params, use_tqdm=False)
    by_url = qwen_llm.chat(
        conversation({"type": "image_url", "image_url": {"url": data_url}}), params, use_tqdm=False
    )
    # The same as rendering the template and passing the image to generate.
    text = qwen_llm.adapter.apply_chat_template(conversation({"type": "image"}))
    direct = qwen_llm.generate(
        prompt_token_ids=[qwen_llm.adapter.encode_prompt(text)],
        sampling_params=params,
        images=[[image]],
        use_tqdm=False,
    )
    assert by_pil[0].prompt == text
    assert by_pil[0].token_ids == by_url[0].token_ids == direct[0].token_ids
    assert len(by_pil[0].token_ids) == 4


def test_chat_refuses_an_image_it_cannot_have(qwen_llm):
    remote = {"type": "image_url", "image_url": {"url": "https://example.com/cat.png"}}
    with pytest.raises(ValueError, match="fetches nothing"):
        qwen_llm.chat([{"role": "user", "content": [remote]}], use_tqdm=False)
    broken = {"type": "image_url", "image_url": {"url": "data:image/png;base64,@@@"}}
    with pytest.raises(ValueError, match="not valid base64"):
        qwen_llm.chat([{"role": "user", "content": [broken]}], use_tqdm=False)
