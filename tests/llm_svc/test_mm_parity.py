"""Greedy output with images equals HF transformers' token for token on both tiny VLM
families (Qwen2-VL with M-RoPE, Idefics3): whole and cut chunks, prefix-cache hits, forced
preemption; each image is encoded once, and a repeated image costs no encode or fetch."""

from __future__ import annotations

import pytest

from llm_svc import LLM
from tests.llm_svc.conftest import greedy
from tests.llm_svc.mm_reference import GatedSource, admit_together, make_image, same_tokens

MAX_NEW = 8


def _llm(reference, **overrides) -> LLM:
    args = dict(page_size=4, max_num_batched_tokens=512, num_pages=512, max_num_seqs=8)
    return LLM(reference.model_dir, **(args | overrides))


def _generate(llm: LLM, prompts, max_new: int = MAX_NEW):
    return llm.generate(
        prompt_token_ids=[p.ids for p in prompts],
        images=[p.images for p in prompts],
        sampling_params=greedy(max_new),
        use_tqdm=False,
    )


@pytest.mark.parametrize("chunk", [512, 5], ids=["whole", "cut"])
def test_greedy_with_images_equals_hf(mm_reference, chunk):
    one = mm_reference.prompt(["Describe", "please"], [make_image(0)])
    two = mm_reference.prompt(["Compare", "with", "now"], [make_image(1), make_image(2, (64, 96))])
    items = [item for p in (one, two) for item in p.items]
    if chunk < 512:
        # Every image is longer than a chunk (Mistral 3's rows may be shorter), so chunks
        # cut images in their middle.
        assert all(item.token_count > chunk for item in items)
    llm = _llm(mm_reference, max_num_batched_tokens=chunk)
    outputs = _generate(llm, [one, two])
    assert same_tokens(outputs[0].token_ids, mm_reference.greedy(one, MAX_NEW))
    assert same_tokens(outputs[1].token_ids, mm_reference.greedy(two, MAX_NEW))
    assert llm.vision.num_encoded == 3  # each image once, however many chunks it spans
    assert llm.engine.fetcher.num_fetched == 3


def test_the_image_matters(mm_reference):
    """Guard against a test that cannot fail: another image changes the greedy output."""
    a = mm_reference.prompt(["Describe", "please"], [make_image(0)])
    b = mm_reference.prompt(["Describe", "please"], [make_image(5)])
    assert a.padded != b.padded  # different sentinels
    outputs = _generate(_llm(mm_reference), [a, b], max_new=16)
    assert same_tokens(outputs[0].token_ids, mm_reference.greedy(a, 16))
    assert same_tokens(outputs[1].token_ids, mm_reference.greedy(b, 16))
    assert outputs[0].token_ids != outputs[1].token_ids


def test_a_repeated_image_reuses_its_pages_and_is_not_encoded_again(mm_reference):
    prompt = mm_reference.prompt(["Describe", "please"], [make_image(3)])
    llm = _llm(mm_reference, max_num_batched_tokens=16)
    first = _generate(llm, [prompt])[0]
    assert first.num_cached_tokens == 0 and llm.vision.num_encoded == 1
    # A new prompt around the same image: the image's pages come from the prefix cache.
    again = _generate(llm, [prompt])[0]
    assert again.token_ids == first.token_ids
    assert same_tokens(first.token_ids, mm_reference.greedy(prompt, MAX_NEW))
    last_image_token = max(end for _, end in prompt.items[0].offsets)
    assert again.num_cached_tokens > last_image_token
    assert llm.engine.fetcher.num_fetched == 1  # nothing fetched the second time
    assert llm.vision.num_encoded == 1


def test_a_partial_prefix_hit_fetches_the_image_past_it(mm_reference):
    """Same image, different text before it: the cached prefix stops before the image, so
    it is fetched (encoded again: the first request's embedding was dropped at its end)."""
    a = mm_reference.prompt(["Describe", "please"], [make_image(4)])
    b = mm_reference.prompt(["Describe this", "please"], [make_image(4)])
    llm = _llm(mm_reference)
    _generate(llm, [a])
    out = _generate(llm, [b])[0]
    assert same_tokens(out.token_ids, mm_reference.greedy(b, MAX_NEW))
    assert out.num_cached_tokens < b.items[0].offsets[0][0]
    assert llm.engine.fetcher.num_fetched == 2


def test_greedy_with_images_under_forced_preemption(mm_reference):
    from llm_svc.engine import EngineConfig, LLMEngine, VisionEmbeddingSource

    prompts = [mm_reference.prompt(["Describe", "please"], [make_image(10 + i)]) for i in range(3)]
    longest = max(len(p.padded) for p in prompts) + MAX_NEW
    # Room for one request and a bit: the others are preempted and re-prefilled.
    pages = -(-longest // 4) + 4
    vision = VisionEmbeddingSource(mm_reference.adapter.vision_runner())
    source = GatedSource(vision)
    config = EngineConfig(mm_reference.model_dir, page_size=4, num_pages=pages,
                          max_num_batched_tokens=24, device="cpu", dtype="float32")  # fmt: skip
    engine = LLMEngine(config, embedding_source=source)
    for index, prompt in enumerate(prompts):
        vision.register(prompt.items[0].key, prompt.images[0])
        engine.add_request(f"r{index}", prompt.padded, greedy(MAX_NEW), items=prompt.items)
    admit_together(engine, source)
    tokens = {f"r{index}": [] for index in range(3)}
    while engine.has_unfinished():
        for out in engine.step():
            tokens[out.request_id] += out.new_token_ids
    assert engine.stats().preemptions > 0
    for index, prompt in enumerate(prompts):
        assert same_tokens(tokens[f"r{index}"], mm_reference.greedy(prompt, MAX_NEW))
    # Re-prefill after preemption used the held embeddings: one encode per image.
    assert vision.num_encoded == 3 and engine.fetcher.num_fetched == 3
    engine.close()


def test_mrope_positions_are_what_make_qwen_match(qwen_reference):
    """First-token log-probabilities equal HF's with M-RoPE from the grid, and differ
    clearly when the same request is run on plain 1-D positions."""
    import numpy as np

    from llm_svc.engine import LLMEngine

    prompt = qwen_reference.prompt(["Describe", "please"], [make_image(6, (448, 112))])
    hf = qwen_reference.first_logprobs(prompt)
    llm = _llm(qwen_reference)
    engine: LLMEngine = llm.engine
    llm.vision.register(prompt.items[0].key, prompt.images[0])
    plain = np.tile(np.arange(len(prompt.padded)), (3, 1))
    for request_id, positions in (("mrope", None), ("plain", plain)):
        engine.add_request(request_id, prompt.padded, greedy(1, logprobs=5),
                           items=prompt.items, mrope_positions=positions)  # fmt: skip
    got = {}
    while engine.has_unfinished():
        for out in engine.step():
            if out.new_logprobs:
                got[out.request_id] = out.new_logprobs[0].top
    worst = {
        request_id: max(abs(logprob - float(hf[token])) for token, logprob in top)
        for request_id, top in got.items()
    }
    # Measured here: ~5e-7 with M-RoPE, ~2e-3 without (a tiny random model barely cares).
    assert worst["mrope"] < 1e-5 and worst["plain"] > 5e-4, worst


def _first_top_logprobs(llm: LLM, prompt) -> list[tuple[int, float]]:
    params = greedy(1, logprobs=5)
    out = llm.generate(
        prompt_token_ids=[prompt.ids], images=[prompt.images], sampling_params=params,
        use_tqdm=False,
    )[0]  # fmt: skip
    return out.logprobs[0].top


@pytest.mark.parametrize("count", [1, 2])
def test_first_token_logprobs_within_1e_4_of_hf(mm_reference, count):
    images = [make_image(20), make_image(21, (160, 64))][:count]
    prompt = mm_reference.prompt(["Look", *["and"] * (count - 1), "now"], images)
    hf = mm_reference.first_logprobs(prompt)
    top = _first_top_logprobs(_llm(mm_reference, max_num_batched_tokens=7), prompt)
    assert len(top) == 5
    worst = max(abs(logprob - float(hf[token])) for token, logprob in top)
    assert worst < 1e-4, worst


def test_images_between_turns_equal_hf(mm_reference):
    """An image in the first user turn, an assistant answer, another image in the next."""
    messages = [
        {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Describe"}]},
        {"role": "assistant", "content": "A cat sits on a red mat."},
        {"role": "user", "content": [{"type": "text", "text": "And"}, {"type": "image"}]},
    ]
    prompt = mm_reference.conversation(messages, [make_image(30), make_image(31, (96, 64))])
    assert len(prompt.items) == 2
    out = _generate(_llm(mm_reference, max_num_batched_tokens=16), [prompt])[0]
    assert same_tokens(out.token_ids, mm_reference.greedy(prompt, MAX_NEW))
