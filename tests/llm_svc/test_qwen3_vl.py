"""Tiny Qwen3-VL and Qwen3-VL-MoE against HF transformers in float32: greedy tokens equal
HF's `generate` on the image processor's inputs and every step's top log-probabilities are
within 1e-4 of HF's, for one image and two images, a chunked prefill that cuts each image,
a prefix hit, and tensor parallelism 2. Deepstack is what makes them match."""

from __future__ import annotations

import pytest
import torch

from llm_svc import LLM
from tests.llm_svc.conftest import greedy
from tests.llm_svc.mm_reference import MMReference, make_image, same_tokens

MAX_NEW = 6
LOGPROB_TOLERANCE = 1e-4


@pytest.fixture(scope="module", params=["tiny_qwen3_vl_dir", "tiny_qwen3_vl_moe_dir"])
def reference(request) -> MMReference:
    return MMReference(request.getfixturevalue(request.param))


def _llm(reference, **overrides) -> LLM:
    args = dict(page_size=4, max_num_batched_tokens=512, num_pages=256, max_num_seqs=4)
    return LLM(reference.model_dir, **(args | overrides))


def _prompts(reference):
    one = reference.prompt(["Describe", "please"], [make_image(0)])
    two = reference.prompt(["Compare", "with", "now"], [make_image(1), make_image(2, (64, 96))])
    return one, two


def _hf_step_logprobs(reference, prompt, steps: int) -> list[torch.Tensor]:
    """HF's log-probabilities [vocab] at each of the first `steps` greedy steps, from its
    raw logits (its scores have EOS masked by min_new_tokens)."""
    ids = torch.tensor([prompt.expanded])
    with torch.inference_mode():
        out = reference._hf().generate(
            ids, attention_mask=torch.ones_like(ids), max_new_tokens=steps,
            min_new_tokens=steps, do_sample=False, output_logits=True,
            return_dict_in_generate=True,
            **reference._pixel_inputs(prompt.images, prompt.expanded),
        )  # fmt: skip
    return [torch.log_softmax(logits[0].float(), dim=-1) for logits in out.logits]


def _check(reference, llm, prompts):
    outputs = llm.generate(
        prompt_token_ids=[p.ids for p in prompts],
        images=[p.images for p in prompts],
        sampling_params=greedy(MAX_NEW, logprobs=3),
        use_tqdm=False,
    )
    for prompt, output in zip(prompts, outputs, strict=True):
        expected = reference.greedy(prompt, MAX_NEW)
        hf = _hf_step_logprobs(reference, prompt, len(expected))
        # HF's min_new_tokens masks EOS where the engine (ignore_eos) may pick it: compare
        # up to the first step whose raw argmax is an EOS.
        eos = set(reference.adapter.eos_token_ids)
        cut = next((i for i, lp in enumerate(hf) if int(lp.argmax()) in eos), len(hf))
        expected = expected[:cut]
        assert len(expected) >= 2, "pick another prompt: HF ends it at once"
        assert same_tokens(output.token_ids, expected), (output.token_ids, expected)
        for step, logprobs in enumerate(output.logprobs[: len(expected)]):
            for token, value in logprobs.top:
                assert abs(value - float(hf[step][token])) < LOGPROB_TOLERANCE
    return outputs


@pytest.mark.parametrize("chunk", [512, 5], ids=["whole", "cut"])
def test_one_and_two_images_equal_hf(reference, chunk):
    one, two = _prompts(reference)
    if chunk < 512:
        spans = [span for p in (one, two) for item in p.items for span in item.offsets]
        assert all(end - start + 1 > chunk for start, end in spans)  # every image is cut
    llm = _llm(reference, max_num_batched_tokens=chunk)
    _check(reference, llm, [one, two])
    assert llm.vision.num_encoded == 3


def test_a_prefix_hit_over_the_image_equals_hf(reference):
    one, _ = _prompts(reference)
    llm = _llm(reference, max_num_batched_tokens=16)
    first = _check(reference, llm, [one])[0]
    again = _check(reference, llm, [one])[0]
    assert again.num_cached_tokens > max(end for _, end in one.items[0].offsets)
    assert again.token_ids == first.token_ids
    assert llm.engine.fetcher.num_fetched == 1  # the second request fetched nothing


def test_deepstack_is_what_makes_them_match(reference):
    """Guard against a test that cannot fail: with the deepstack levels zeroed in the
    fetched rows, the first token's log-probabilities leave the tolerance."""
    from llm_svc.engine import VisionEmbeddingSource

    one, _ = _prompts(reference)
    hidden = reference.adapter.hidden_size
    runner = reference.adapter.vision_runner()

    class NoDeepstack(type(runner)):
        def encode(self, prepared):
            out = super().encode(prepared)
            return [torch.cat([r[:, :hidden], torch.zeros_like(r[:, hidden:])], 1) for r in out]

    runner.__class__ = NoDeepstack
    llm = _llm(reference)
    llm.vision = VisionEmbeddingSource(runner)
    llm.engine.fetcher.source = llm.vision
    out = llm.generate(prompt_token_ids=[one.ids], images=[one.images],
                       sampling_params=greedy(1, logprobs=3), use_tqdm=False)[0]  # fmt: skip
    hf = _hf_step_logprobs(reference, one, 1)[0]
    worst = max(abs(value - float(hf[token])) for token, value in out.logprobs[0].top)
    assert worst > 100 * LOGPROB_TOLERANCE, worst


def test_tensor_parallel_2_equals_hf(tiny_qwen3_vl_moe_dir):
    """On the MoE model only (rank start-up is most of this family's test time): it covers
    the sharded q/k-normed attention, every level on every rank, and the sharded experts;
    the dense MLP's sharding is the Qwen2 families' (test_tensor_parallel)."""
    reference = MMReference(tiny_qwen3_vl_moe_dir)
    _, two = _prompts(reference)  # two images, chunks of 24 cutting them
    llm = _llm(reference, tensor_parallel_size=2, max_num_batched_tokens=24)
    try:
        _check(reference, llm, [two])
    finally:
        llm.engine.close()
