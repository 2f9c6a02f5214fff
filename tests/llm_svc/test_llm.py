"""The offline API: LLM.generate and LLM.chat."""

from __future__ import annotations

import pytest

from llm_svc import LLM, SamplingParams
from llm_svc.engine import InvalidRequestError


@pytest.fixture(scope="module")
def llm(llama_dir):
    return LLM(llama_dir, page_size=4, num_pages=128, max_num_batched_tokens=16, max_num_seqs=2)


def test_results_in_input_order_with_params_copied(llm):
    prompts = ["The quick brown fox", "hello", "The capital of France is Paris. A cat sat"]
    params = [SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True) for n in (5, 9, 3)]
    outputs = llm.generate(prompts, params, use_tqdm=False)
    assert [o.prompt for o in outputs] == prompts
    assert [len(o.token_ids) for o in outputs] == [5, 9, 3]
    assert all(o.finish_reason == "length" for o in outputs)
    assert [p.max_tokens for p in params] == [5, 9, 3]
    # One shared params object behaves like one per prompt, and alone each prompt agrees.
    shared = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)
    together = llm.generate(prompts, shared, use_tqdm=False)
    alone = [llm.generate(p, shared, use_tqdm=False)[0] for p in prompts]
    assert [o.token_ids for o in together] == [o.token_ids for o in alone]
    assert [o.text for o in together] == [o.text for o in alone]


def test_prompt_token_ids_and_text_agree(llm):
    shared = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)
    ids = llm.tokenizer("hello world")["input_ids"]
    by_ids = llm.generate(prompt_token_ids=[ids], sampling_params=shared, use_tqdm=False)
    flat = llm.generate(prompt_token_ids=ids, sampling_params=shared, use_tqdm=False)
    by_text = llm.generate("hello world", shared, use_tqdm=False)
    assert by_ids[0].token_ids == flat[0].token_ids == by_text[0].token_ids
    assert by_ids[0].prompt is None and by_ids[0].prompt_token_ids == ids


def test_an_invalid_request_raises_with_its_index(llm):
    good = SamplingParams(temperature=0.0, max_tokens=2)
    with pytest.raises(InvalidRequestError, match="prompt 1: temperature"):
        llm.generate(["a", "b"], [good, SamplingParams(temperature=-1.0)], use_tqdm=False)
    with pytest.raises(InvalidRequestError, match=r"prompt 2: prompt_token_ids\[0\]=9999"):
        llm.generate(prompt_token_ids=[[1], [2], [9999]], use_tqdm=False)
    assert not llm.engine.has_unfinished()
    assert llm.engine.blocks.num_used == 0
    with pytest.raises(ValueError, match="2 sampling params for 3 prompts"):
        llm.generate(["a", "b", "c"], [good, good], use_tqdm=False)


def test_chat_applies_the_template(llm):
    messages = [{"role": "user", "content": "hello"}]
    out = llm.chat(messages, SamplingParams(temperature=0.0, max_tokens=3), use_tqdm=False)
    assert out[0].prompt == "<|user|>hello<|end|><|assistant|>"
    expected = llm.tokenizer(out[0].prompt, add_special_tokens=False)["input_ids"]
    assert out[0].prompt_token_ids == expected
    two = llm.chat([messages, messages], SamplingParams(temperature=0.0), use_tqdm=False)
    assert two[0].token_ids == two[1].token_ids


def test_chat_with_an_image_on_a_text_model_names_the_problem(llm):
    part = {"type": "image", "image": b"\x89PNG"}
    with pytest.raises(InvalidRequestError, match="takes no images"):
        llm.chat([{"role": "user", "content": [part]}], use_tqdm=False)
