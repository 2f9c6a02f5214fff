"""Tiny Qwen3.5 and Qwen3.5-MoE image-text models against HF transformers in float32: greedy
tokens equal HF's `generate` on the image processor's inputs and every step's top
log-probabilities are within 1e-4 of HF's, for one image and two images, a chunked prefill
that cuts each image, and a prefix hit over an image (the hybrid decoder resumes from a
state snapshot). Interleaved M-RoPE on the partial rotary dims is what makes them match."""

from __future__ import annotations

import pytest

from tests.llm_svc.conftest import greedy
from tests.llm_svc.mm_reference import MMReference
from tests.llm_svc.test_qwen3_vl import LOGPROB_TOLERANCE, _check, _hf_step_logprobs, _prompts


@pytest.fixture(scope="module", params=["tiny_qwen3_5_vl_dir", "tiny_qwen3_5_vl_moe_dir"])
def reference(request) -> MMReference:
    return MMReference(request.getfixturevalue(request.param))


def _llm(reference, **overrides):
    from llm_svc import LLM

    args = dict(page_size=4, max_num_batched_tokens=512, num_pages=256, max_num_seqs=4,
                state_snapshot_interval=2)  # fmt: skip
    return LLM(reference.model_dir, **(args | overrides))


@pytest.mark.parametrize("chunk", [512, 5], ids=["whole", "cut"])
def test_one_and_two_images_equal_hf(reference, chunk):
    one, two = _prompts(reference)
    if chunk < 512:
        spans = [span for p in (one, two) for item in p.items for span in item.offsets]
        assert all(end - start + 1 > chunk for start, end in spans)  # every image is cut
    llm = _llm(reference, max_num_batched_tokens=chunk)
    assert llm.engine.model_config.is_hybrid
    _check(reference, llm, [one, two])
    assert llm.vision.num_encoded == 3


def test_a_prefix_hit_over_the_image_equals_hf(reference):
    one, _ = _prompts(reference)
    llm = _llm(reference, max_num_batched_tokens=16)
    first = _check(reference, llm, [one])[0]
    again = _check(reference, llm, [one])[0]
    # A hybrid model resumes from the deepest state snapshot (every 2 pages = 8 tokens).
    assert again.num_cached_tokens > max(end for _, end in one.items[0].offsets)
    assert again.num_cached_tokens % 8 == 0
    assert again.token_ids == first.token_ids
    assert llm.engine.fetcher.num_fetched == 1  # the second request fetched nothing


def test_interleaved_m_rope_is_what_makes_them_match(reference):
    """Guard against a test that cannot fail: with the rotary bands in Qwen2-VL's blocks
    (t t h w) instead of interleaved (t h w t), the first token's log-probabilities over
    an image prompt leave the tolerance."""
    one, _ = _prompts(reference)
    llm = _llm(reference)
    rotary = llm.engine.runner.model.rotary
    assert rotary.mrope_interleaved and rotary.mrope_section == (2, 1, 1)
    rotary.mrope_interleaved = False
    rotary._tables.clear()
    out = llm.generate(prompt_token_ids=[one.ids], images=[one.images],
                       sampling_params=greedy(1, logprobs=3), use_tqdm=False)[0]  # fmt: skip
    hf = _hf_step_logprobs(reference, one, 1)[0]
    worst = max(abs(value - float(hf[token])) for token, value in out.logprobs[0].top)
    assert worst > 10 * LOGPROB_TOLERANCE, worst
