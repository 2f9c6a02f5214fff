"""A reasoning request's grammar starts after the thought (issue 45, item 6): against the
real xgrammar matcher compiled for a tokenizer that has `<think>`/`</think>` as added tokens,
a thought full of tokens the schema forbids is accepted and masks nothing; the model's
end-of-thought token (read from its tokenizer, iris.models.reasoning) wakes the grammar,
which then masks and accepts exactly as a grammar from the first token does."""

from __future__ import annotations

import concurrent.futures as cf
import json

import pytest
import torch

from iris.models.reasoning import think_markers
from llm_svc.engine import SamplingParams
from llm_svc.engine.grammar import RequestGrammar, StepConstraints
from llm_svc.engine.grammar.request import GrammarViolation
from llm_svc.engine.grammar.spec import Constraint, ConstraintKind
from llm_svc.engine.sequence import Sequence

xgrammar = pytest.importorskip("xgrammar")
SCHEMA = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}


@pytest.fixture(scope="module")
def tokenizer(tiny_thinking_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(tiny_thinking_dir))


def grammar(tokenizer, vocab_size: int, opens_after: int | None) -> RequestGrammar:
    info = xgrammar.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab_size)
    compiled = xgrammar.GrammarCompiler(info).compile_json_schema(json.dumps(SCHEMA))
    future = cf.Future()
    future.set_result(compiled)
    constraint = Constraint(ConstraintKind.JSON_SCHEMA, json.dumps(SCHEMA))
    request = RequestGrammar(constraint, future, 1.0, opens_after=opens_after)
    request.start()
    return request


def masked(seq: Sequence, vocab_size: int) -> int:
    """How many tokens this step's constraints forbid `seq`."""
    logits = torch.zeros(1, vocab_size)
    StepConstraints(vocab_size, torch.device("cpu")).apply(logits, [seq])
    return int(torch.isinf(logits).sum())


def test_the_thought_is_free_and_the_answer_follows_the_grammar(tokenizer, tiny_thinking_dir):
    vocab_size = json.loads((tiny_thinking_dir / "config.json").read_text())["text_config"][
        "vocab_size"
    ]
    markers = think_markers(tokenizer)
    assert markers is not None and markers.end_id == tokenizer.convert_tokens_to_ids("</think>")
    seq = Sequence("r", [1, 2, 3], SamplingParams(reasoning=True))
    seq.grammar = grammar(tokenizer, vocab_size, markers.end_id)
    thought = tokenizer.encode("<think>The answer } is ]] not JSON", add_special_tokens=False)
    for token in thought:
        assert masked(seq, vocab_size) == 0  # dormant: nothing is masked
        seq.grammar.accept(token)
        assert not seq.grammar.terminated
    seq.grammar.accept(markers.end_id)
    assert seq.grammar.active and masked(seq, vocab_size) > 0
    with pytest.raises(GrammarViolation):  # the answer must open the object
        seq.grammar.accept(tokenizer.convert_tokens_to_ids("]"))
    for token in tokenizer.encode('{"n": 7}', add_special_tokens=False):
        seq.grammar.accept(token)
    seq.grammar.accept(tokenizer.eos_token_id)
    assert seq.grammar.terminated


def test_without_reasoning_the_grammar_masks_from_the_first_token(tokenizer, tiny_thinking_dir):
    vocab_size = json.loads((tiny_thinking_dir / "config.json").read_text())["text_config"][
        "vocab_size"
    ]
    seq = Sequence("r", [1, 2, 3], SamplingParams())
    seq.grammar = grammar(tokenizer, vocab_size, None)
    assert masked(seq, vocab_size) > 0
    with pytest.raises(GrammarViolation):
        seq.grammar.accept(think_markers(tokenizer).end_id)
