"""Greedy output equals HF transformers' greedy output token for token: plain, with prefix
cache hits, with chunks that cut pages, and under forced preemption."""

from __future__ import annotations

from tests.llm_svc.conftest import greedy, make_engine, run_all, token_ids

PROMPTS = [
    "The quick brown fox jumps over",
    "hello world, how are you today? I am fine, thank you very much.",
    "The capital of France is Paris. A cat sat on the mat; the dog ran",
]
NEW_TOKENS = 10


def _prompt_ids(engine, text: str) -> list[int]:
    return engine.tokenizer(text)["input_ids"]


def _check_against_hf(engine, model_dir, hf_reference, prompts, new_tokens=NEW_TOKENS):
    ids = [_prompt_ids(engine, text) for text in prompts]
    outputs = run_all(engine, {str(i): (p, greedy(new_tokens)) for i, p in enumerate(ids)})
    for i, prompt in enumerate(ids):
        expected = hf_reference.greedy(model_dir, prompt, new_tokens)
        assert token_ids(outputs[str(i)]) == expected, f"prompt {i}"
    return outputs


def test_greedy_matches_hf_with_mid_page_chunks_and_prefix_hits(model_dir, hf_reference):
    # Budget 7 with pages of 4: every prefill chunk ends mid-page; decodes share steps.
    engine = make_engine(model_dir, max_num_batched_tokens=7)
    _check_against_hf(engine, model_dir, hf_reference, PROMPTS)
    # The same prompts again: served from the prefix cache, same tokens.
    outputs = _check_against_hf(engine, model_dir, hf_reference, PROMPTS)
    assert all(outs[-1].num_cached_tokens > 0 for outs in outputs.values())


def test_greedy_matches_hf_under_preemption(model_dir, hf_reference):
    # 14 pages of 4 tokens cannot hold three ~30-token sequences at once.
    engine = make_engine(model_dir, num_pages=14, max_num_batched_tokens=16)
    prompts = [text + " and then" for text in PROMPTS]
    _check_against_hf(engine, model_dir, hf_reference, prompts, new_tokens=12)
    assert engine.stats().preemptions > 0


def test_greedy_matches_hf_without_prefix_cache(llama_dir, hf_reference):
    engine = make_engine(llama_dir, enable_prefix_caching=False, max_num_batched_tokens=5)
    _check_against_hf(engine, llama_dir, hf_reference, PROMPTS + PROMPTS[:1])
    assert engine.take_kv_events() == []


def test_demo_model_language_model_matches_hf(demo_dir, hf_reference):
    engine = make_engine(demo_dir, page_size=16, max_num_batched_tokens=24, num_pages=64)
    prompts = ["The capital of France is", "The capital of France is a city where"]
    _check_against_hf(engine, demo_dir, hf_reference, prompts, new_tokens=6)
