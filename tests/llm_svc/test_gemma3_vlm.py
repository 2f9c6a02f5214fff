"""Gemma 3 with images on the tiny checkpoint: greedy tokens equal HF transformers' generate
on the processor's inputs (float32), image tokens attending to each other both ways inside
each image; prefill chunks never split an image span; a cached prefix never resumes inside
one; preemption."""

from __future__ import annotations

import pytest

from llm_svc import LLM
from llm_svc.engine.models.config import UnsupportedModelError
from tests.llm_svc.conftest import greedy
from tests.llm_svc.mm_reference import make_image, same_tokens

MAX_NEW = 8
PAGE = 4


def _llm(reference, **overrides) -> LLM:
    args = dict(page_size=PAGE, max_num_batched_tokens=512, num_pages=256, max_num_seqs=4)
    return LLM(reference.model_dir, **(args | overrides))


def _generate(llm: LLM, prompts, max_new: int = MAX_NEW, **params):
    return llm.generate(
        prompt_token_ids=[p.ids for p in prompts],
        images=[p.images for p in prompts],
        sampling_params=greedy(max_new, **params),
        use_tqdm=False,
    )


def test_one_and_two_images_equal_hf(gemma3_reference):
    ref = gemma3_reference
    one = ref.prompt(["Describe", "please"], [make_image(0, (80, 48))])
    two = ref.prompt(["Compare", "with", "now"], [make_image(1), make_image(2, (64, 96))])
    outputs = _generate(_llm(ref), [one, two])
    assert same_tokens(outputs[0].token_ids, ref.greedy(one, MAX_NEW))
    assert same_tokens(outputs[1].token_ids, ref.greedy(two, MAX_NEW))


def test_images_between_text_turns_equal_hf(gemma3_reference):
    ref = gemma3_reference
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What?"}]},
        {"role": "assistant", "content": "A cat."},
        {"role": "user", "content": [{"type": "text", "text": "And"}, {"type": "image"}]},
    ]
    prompt = ref.conversation(messages, [make_image(3, (48, 80)), make_image(4)])
    out = _generate(_llm(ref), [prompt])[0]
    assert same_tokens(out.token_ids, ref.greedy(prompt, MAX_NEW))


def _first_logprobs(llm: LLM, prompt, *, both_ways: bool) -> list[tuple[int, float]]:
    engine = llm.engine
    llm.vision.register(prompt.items[0].key, prompt.images[0])
    seq = engine.add_request("r", prompt.padded, greedy(1, logprobs=5), items=prompt.items)
    if not both_ways:
        seq.uncut_spans = []  # what a causal-only engine would do with the same request
    top = None
    while engine.has_unfinished():
        for out in engine.step():
            if out.new_logprobs:
                top = out.new_logprobs[0].top
    return top


@pytest.mark.parametrize("backend", ["sdpa", "triton"])
def test_logprobs_within_1e_4_and_the_image_attends_both_ways(
    gemma3_reference, backend, monkeypatch
):
    """First-token log-probabilities equal HF's within 1e-4 in both attention backends
    (Triton interpreted); the same request with the image's tokens attending causally only
    is clearly off (the test can fail)."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    ref = gemma3_reference
    prompt = ref.prompt(["Look", "closely"], [make_image(7, (72, 40))])
    hf = ref.first_logprobs(prompt)
    worst = {}
    for both_ways in (True, False):
        llm = _llm(ref, attention_backend=backend)
        top = _first_logprobs(llm, prompt, both_ways=both_ways)
        worst[both_ways] = max(abs(logprob - float(hf[token])) for token, logprob in top)
    assert worst[True] < 1e-4 and worst[False] > 1e-3, worst


def test_a_budget_smaller_than_one_span_is_refused_at_load(gemma3_reference):
    span = gemma3_reference.adapter.tokens_per_image
    with pytest.raises(UnsupportedModelError, match=f"max_num_batched_tokens={span - 1}"):
        _llm(gemma3_reference, max_num_batched_tokens=span - 1)
    _llm(gemma3_reference, max_num_batched_tokens=span)  # one span is enough


def test_a_chunk_overflows_its_budget_by_the_span_it_would_cut(gemma3_reference):
    """Budget between one span and one image plus its surrounding text: the chunk that
    reaches the image takes the whole span, so it exceeds the budget; none cuts a span."""
    ref = gemma3_reference
    prompt = ref.prompt(["Describe the picture", "please"], [make_image(8)])
    (start, end), span = prompt.items[0].offsets[0], ref.adapter.tokens_per_image
    budget = span + 4
    assert span <= budget < end + 1 and start % budget != 0
    llm = _llm(ref, max_num_batched_tokens=budget)
    chunks = []
    schedule = llm.engine.scheduler.schedule

    def recording():
        out = schedule()
        chunks.extend((chunk.start, chunk.num_tokens) for chunk in out.chunks)
        return out

    llm.engine.scheduler.schedule = recording
    out = _generate(llm, [prompt])[0]
    assert same_tokens(out.token_ids, ref.greedy(prompt, MAX_NEW))
    assert max(count for _, count in chunks) > budget
    for first, count in chunks:
        assert not (start < first + count <= end), "a chunk ended inside the image span"


def test_a_prefix_hit_ends_before_an_image_never_inside_it(gemma3_reference):
    ref = gemma3_reference
    a = ref.prompt(["Describe the picture", "please"], [make_image(9)])
    b = ref.prompt(["Describe the picture", "please"], [make_image(10)])
    start, end = a.items[0].offsets[0]
    llm = _llm(ref)
    _generate(llm, [a])
    # Another image after the same text: the hit ends where the images differ, before b's.
    out = _generate(llm, [b])[0]
    assert same_tokens(out.token_ids, ref.greedy(b, MAX_NEW))
    assert out.num_cached_tokens == start // PAGE * PAGE > 0
    # The same prompt again, with the cache cut back to a page that ends inside the span:
    # the hit backs off to the span's first page rather than resume inside it.
    blocks = llm.engine.blocks
    inside = (start + end) // 2 // PAGE + 1  # pages up to one ending inside the span
    assert start < inside * PAGE <= end
    while len(blocks.cache.match(a.padded)) > inside:  # least recently used leaves first
        blocks.free_pages.extend(blocks.cache.evict(1))
    assert len(blocks.cache.match(a.padded)) == inside
    again = _generate(llm, [a])[0]
    assert same_tokens(again.token_ids, ref.greedy(a, MAX_NEW))
    assert again.num_cached_tokens == start // PAGE * PAGE


def test_greedy_with_images_under_forced_preemption(gemma3_reference):
    from llm_svc.engine import EngineConfig, LLMEngine, VisionEmbeddingSource
    from tests.llm_svc.mm_reference import GatedSource, admit_together

    ref = gemma3_reference
    prompts = [ref.prompt(["Describe", "please"], [make_image(20 + i)]) for i in range(3)]
    longest = max(len(p.padded) for p in prompts) + MAX_NEW
    vision = VisionEmbeddingSource(ref.adapter.vision_runner())
    source = GatedSource(vision)
    config = EngineConfig(ref.model_dir, page_size=PAGE, num_pages=-(-longest // PAGE) + 4,
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
        assert same_tokens(tokens[f"r{index}"], ref.greedy(prompt, MAX_NEW))
    engine.close()


def test_tensor_parallel_2_equals_hf(gemma3_reference):
    ref = gemma3_reference
    prompt = ref.prompt(["Compare", "with", "now"], [make_image(30), make_image(31, (64, 96))])
    llm = _llm(ref, tensor_parallel_size=2, max_num_batched_tokens=24, dtype="float32")
    try:
        out = _generate(llm, [prompt])[0]
    finally:
        llm.engine.close()
    assert same_tokens(out.token_ids, ref.greedy(prompt, MAX_NEW))
