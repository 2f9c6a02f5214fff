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
