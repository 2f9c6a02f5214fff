"""Gemma 4 with images on the tiny checkpoints: the vision runner equals HF's
get_image_features; greedy tokens equal HF generate (float32) with images of different
aspect ratios, between turns, under a chunk budget that would cut a span, after a prefix
hit, under preemption and with the MoE block; image spans attend both ways on sliding
layers only (the E-style model, without "vision" attention, stays causal, and its
per-layer table reads the pad id at image rows); the audio tower is never loaded."""

from __future__ import annotations

import pytest
import torch

from llm_svc import LLM
from tests.llm_svc.conftest import greedy
from tests.llm_svc.mm_reference import make_image, same_tokens

MAX_NEW = 6
TEXT = ["Describe the picture in front of you now", "please"]
PAGE = 4


def _llm(reference, **overrides) -> LLM:
    args = dict(page_size=PAGE, max_num_batched_tokens=512, num_pages=256, max_num_seqs=4)
    return LLM(reference.model_dir, **(args | overrides))


def _generate(llm: LLM, prompts):
    return llm.generate(
        prompt_token_ids=[p.ids for p in prompts],
        images=[p.images for p in prompts],
        sampling_params=greedy(MAX_NEW),
        use_tqdm=False,
    )


@pytest.mark.parametrize("which", ["gemma4_reference", "gemma4_e_reference"])
def test_the_runner_equals_get_image_features(request, which):
    """Clipped linears and standardisation (gemma4), neither (gemma4_e); a wide and a
    tall image in one batch, each padded to the budget's patches."""
    from transformers.models.gemma4.image_processing_pil_gemma4 import (
        Gemma4ImageProcessorPil,
    )

    ref = request.getfixturevalue(which)
    images = [make_image(0, (90, 40)), make_image(1, (30, 120))]
    ours = ref.embeddings(images)
    pil = Gemma4ImageProcessorPil.from_pretrained(str(ref.model_dir))
    out = pil(images=images, return_tensors="pt")
    with torch.inference_mode():
        features = ref._hf().model.get_image_features(
            out["pixel_values"], out["image_position_ids"]
        )
    theirs = features.pooler_output
    assert [t.shape[0] for t in ours] == out["num_soft_tokens_per_image"].tolist()
    for mine, hf in zip(ours, theirs, strict=True):
        torch.testing.assert_close(mine, hf, atol=1e-5, rtol=0)


def test_one_and_two_images_and_turns_equal_hf(gemma4_reference):
    ref = gemma4_reference
    one = ref.prompt(["Describe", "please"], [make_image(2, (80, 48))])
    two = ref.prompt(["Compare", "with", "now"], [make_image(3), make_image(4, (40, 130))])
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What?"}]},
        {"role": "assistant", "content": "A cat."},
        {"role": "user", "content": [{"type": "text", "text": "And"}, {"type": "image"}]},
    ]
    turns = ref.conversation(messages, [make_image(5, (48, 80)), make_image(6, (70, 70))])
    outputs = _generate(_llm(ref), [one, two, turns])
    for prompt, out in zip((one, two, turns), outputs, strict=True):
        assert same_tokens(out.token_ids, ref.greedy(prompt, MAX_NEW))


def test_full_layers_keep_image_spans_causal(gemma4_reference, monkeypatch):
    """With the spans both ways on every layer (Gemma 3's rule) the first token's
    log-probabilities leave HF's; as served they are within 1e-4 (the test can fail)."""
    from llm_svc.engine.models import gemma4

    ref = gemma4_reference
    prompt = ref.prompt(["Look", "closely"], [make_image(7, (72, 40))])
    hf = ref.first_logprobs(prompt)
    worst = {}
    for full_both_ways in (False, True):
        if full_both_ways:
            monkeypatch.setattr(gemma4.Gemma4Attention, "causal_on_full", False)
        llm = _llm(ref)
        llm.vision.register(prompt.items[0].key, prompt.images[0])
        seq = llm.engine.add_request("r", prompt.padded, greedy(1, logprobs=5), items=prompt.items)
        top = None
        while llm.engine.has_unfinished():
            for out in llm.engine.step():
                top = out.new_logprobs[0].top if out.new_logprobs else top
        assert seq.uncut_spans
        worst[full_both_ways] = max(abs(lp - float(hf[token])) for token, lp in top)
    assert worst[False] < 1e-4 and worst[True] > 1e-3, worst


def test_triton_keeps_full_layers_causal_as_sdpa_does(gemma4_reference, monkeypatch):
    """The Triton extend kernel (interpreted) drops `attend_until` on full layers too."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    ref = gemma4_reference
    prompt = ref.prompt(["Look", "closely"], [make_image(7, (72, 40))])
    out = _generate(_llm(ref, attention_backend="triton"), [prompt])[0]
    assert same_tokens(out.token_ids, ref.greedy(prompt, MAX_NEW))


def test_a_chunk_takes_the_span_it_would_cut_and_a_prefix_hit_stops_before_one(
    gemma4_reference,
):
    ref = gemma4_reference
    prompt = ref.prompt(TEXT, [make_image(8, (100, 100))])
    (start, end) = prompt.items[0].offsets[0]
    budget = ref.adapter.max_uncut_span + 4
    assert start % budget != 0 and end + 1 > budget
    llm = _llm(ref, max_num_batched_tokens=budget)
    chunks = []
    schedule = llm.engine.scheduler.schedule

    def recording():
        out = schedule()
        chunks.extend((chunk.start, chunk.num_tokens) for chunk in out.chunks)
        return out

    llm.engine.scheduler.schedule = recording
    assert same_tokens(_generate(llm, [prompt])[0].token_ids, ref.greedy(prompt, MAX_NEW))
    assert max(count for _, count in chunks) > budget  # the chunk grew to the span's end
    for first, count in chunks:
        assert not (start < first + count <= end), "a chunk ended inside the image span"
    # The same text with another image: the hit ends at the page before the span.
    other = ref.prompt(TEXT, [make_image(9, (100, 100))])
    out = _generate(llm, [other])[0]
    assert same_tokens(out.token_ids, ref.greedy(other, MAX_NEW))
    assert out.num_cached_tokens == start // PAGE * PAGE > 0


def test_a_budget_smaller_than_the_longest_span_is_refused_at_load(gemma4_reference):
    from llm_svc.engine.models.config import UnsupportedModelError

    span = gemma4_reference.adapter.max_uncut_span
    assert span == 70  # the tiny model's image and video budgets
    with pytest.raises(UnsupportedModelError, match=f"max_num_batched_tokens={span - 1}"):
        _llm(gemma4_reference, max_num_batched_tokens=span - 1)


def test_greedy_with_images_under_forced_preemption(gemma4_reference):
    from llm_svc.engine import EngineConfig, LLMEngine, VisionEmbeddingSource
    from tests.llm_svc.mm_reference import GatedSource, admit_together

    ref = gemma4_reference
    prompts = [ref.prompt(["Describe", "please"], [make_image(20 + i, (60, 40))]) for i in range(3)]
    # Two prompts fit, not their growth: the second to grow preempts the other.
    pages = 2 * -(-max(len(p.padded) for p in prompts) // PAGE) + 1
    vision = VisionEmbeddingSource(ref.adapter.vision_runner())
    source = GatedSource(vision)
    config = EngineConfig(ref.model_dir, page_size=PAGE, num_pages=pages,
                          max_num_batched_tokens=80, device="cpu", dtype="float32")  # fmt: skip
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


def test_the_e_model_equals_hf_and_never_loads_its_audio_tower(gemma4_e_reference):
    ref = gemma4_e_reference
    assert not ref.adapter.bidirectional_image_spans
    assert any("audio_tower" in name for name in ref.adapter.weight_names)
    prompt = ref.prompt(["Compare", "with", "now"], [make_image(10), make_image(11, (40, 130))])
    llm = _llm(ref)
    assert same_tokens(_generate(llm, [prompt])[0].token_ids, ref.greedy(prompt, MAX_NEW))
    loaded = [name for name, _ in llm.engine.runner.model.named_parameters()]
    loaded += [name for name, _ in llm.vision._runner.tower.named_parameters()]
    assert loaded and not any("audio" in name for name in loaded)


def test_the_moe_model_equals_hf_with_two_images(tiny_gemma4_moe_dir):
    from tests.llm_svc.mm_reference import MMReference

    ref = MMReference(tiny_gemma4_moe_dir)
    prompt = ref.prompt(["Compare", "with", "now"], [make_image(12, (90, 40)), make_image(13)])
    assert same_tokens(_generate(_llm(ref), [prompt])[0].token_ids, ref.greedy(prompt, MAX_NEW))
