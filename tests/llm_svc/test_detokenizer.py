"""Incremental detokenization equals decoding everything at once."""

from __future__ import annotations

import pytest
from transformers import AutoTokenizer

from llm_svc.engine.detokenizer import IncrementalDetokenizer


@pytest.fixture(scope="module")
def tokenizer(llama_dir):
    return AutoTokenizer.from_pretrained(str(llama_dir))


@pytest.mark.parametrize(
    "text", ["hello world, how are you?", "Ünïcödé ✓ 日本語 and more", " leading  spaces\n\nend"]
)
def test_token_by_token_text_equals_full_decode(tokenizer, text):
    prompt = tokenizer("The capital")["input_ids"]
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    detok = IncrementalDetokenizer(tokenizer, prompt)
    pieces = [detok.add(token) for token in ids]
    assert "".join(pieces) + detok.flush() == text
    # A multi-byte character is never released half-way.
    assert all("\ufffd" not in piece for piece in pieces)


def test_special_tokens_are_skipped_unless_asked(tokenizer):
    end = tokenizer.convert_tokens_to_ids("<|end|>")
    hello = tokenizer("hello", add_special_tokens=False)["input_ids"]
    skip = IncrementalDetokenizer(tokenizer, [], skip_special_tokens=True)
    keep = IncrementalDetokenizer(tokenizer, [], skip_special_tokens=False)
    assert "".join(skip.add(t) for t in [*hello, end]) == "hello"
    assert "".join(keep.add(t) for t in [*hello, end]) == "hello<|end|>"


def test_an_incomplete_character_at_the_end_is_flushed(tokenizer):
    # "æ" is byte-level BPE's token for the byte 0xE6, the first of three bytes of "日".
    first_byte = tokenizer.convert_tokens_to_ids("æ")
    detok = IncrementalDetokenizer(tokenizer, [])
    assert detok.add(first_byte) == ""  # held back: not a whole character yet
    assert detok.flush() == "\ufffd"
    assert detok.flush() == ""


def test_sentinel_ids_in_the_prompt_are_not_decoded(tokenizer):
    detok = IncrementalDetokenizer(tokenizer, [5, 1_000_123, 6])
    ids = tokenizer("ok", add_special_tokens=False)["input_ids"]
    assert "".join(detok.add(t) for t in ids) == "ok"
