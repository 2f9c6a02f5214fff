"""Request boundary checks, stop conditions, streaming deltas and aborts."""

from __future__ import annotations

import pytest

from llm_svc.engine import InvalidRequestError, RequestTooLargeError, SamplingParams
from tests.llm_svc.conftest import greedy, make_engine, run_all, token_ids

PROMPT = list(range(40, 52))


@pytest.fixture(scope="module")
def engine(llama_dir):
    return make_engine(llama_dir, max_model_len=64, num_pages=32)


@pytest.mark.parametrize(
    ("ids", "params", "needle"),
    [
        ([], greedy(4), "must not be empty"),
        ([1, 2, 384], greedy(4), "prompt_token_ids[2]=384"),
        ([1, -1], greedy(4), "[0, 384)"),
        (list(range(64)), greedy(4), "max_model_len 64"),
        (PROMPT, SamplingParams(temperature=-0.5), "temperature=-0.5"),
        # A model without think markers has no thought to start a grammar after.
        (PROMPT, greedy(4, reasoning=True), "needs a model whose tokenizer"),
        (PROMPT, SamplingParams(top_p=0.0), "top_p"),
        (PROMPT, SamplingParams(max_tokens=0), "max_tokens"),
        (PROMPT, SamplingParams(frequency_penalty=3.0), "[-2, 2]"),
        (PROMPT, SamplingParams(temperature=float("nan")), "temperature"),
        (PROMPT, SamplingParams(logprobs=21), "logprobs"),
        (PROMPT, SamplingParams(stop_token_ids=[999]), "stop_token_ids"),
        (PROMPT, SamplingParams(max_tokens=4, min_tokens=5), "min_tokens"),
        (PROMPT, SamplingParams(stop=[""]), "stop"),
        (PROMPT, SamplingParams(max_tokens="7"), "max_tokens='7'"),
        (PROMPT, SamplingParams(temperature=None), "temperature=None"),
    ],
)
def test_a_bad_request_fails_alone(engine, ids, params, needle):
    engine.add_request("good", PROMPT, greedy(3))
    with pytest.raises(InvalidRequestError) as error:
        engine.add_request("bad", ids, params)
    assert needle in str(error.value)
    assert "bad" not in engine.requests
    outputs = run_all(engine, {})
    assert list(outputs) == ["good"] and outputs["good"][-1].finish_reason == "length"
    assert len(token_ids(outputs["good"])) == 3 and not engine.has_unfinished()


def test_good_request_completes_beside_a_refused_one(engine):
    engine.add_request("ok", PROMPT, greedy(3))
    with pytest.raises(InvalidRequestError):
        engine.add_request("nope", [5000], greedy(3))
    finished = [o for _ in range(10) for o in engine.step() if o.finished]
    assert [o.request_id for o in finished] == ["ok"]
    assert finished[0].finish_reason == "length"


def test_a_request_that_can_never_fit_gets_a_clear_error(llama_dir):
    small = make_engine(llama_dir, num_pages=4, page_size=4)
    with pytest.raises(RequestTooLargeError, match="needs 5 KV pages of 4 tokens .* has 4"):
        small.add_request("big", PROMPT, greedy(5))
    small.add_request("fits", PROMPT, greedy(4))  # exactly 4 pages


def test_duplicate_request_id_is_refused(engine):
    engine.add_request("dup", PROMPT, greedy(2))
    with pytest.raises(InvalidRequestError, match="already in use"):
        engine.add_request("dup", PROMPT, greedy(2))
    run_all(engine, {})


def test_streamed_deltas_add_up_and_stop_strings_are_trimmed(engine):
    reference = run_all(engine, {"r": (PROMPT, greedy(12))})["r"]
    full_text = "".join(o.new_text for o in reference)
    assert full_text == engine.tokenizer.decode(token_ids(reference))
    stop = full_text[len(full_text) // 2 : len(full_text) // 2 + 2]
    assert stop.strip(), "need a visible stop string"
    outputs = run_all(engine, {"s": (PROMPT, greedy(12, stop=[stop]))})["s"]
    text = "".join(o.new_text for o in outputs)
    assert text == full_text[: full_text.index(stop)]
    assert outputs[-1].finish_reason == "stop"
    kept = run_all(
        engine, {"k": (PROMPT, greedy(12, stop=[stop], include_stop_str_in_output=True))}
    )
    assert "".join(o.new_text for o in kept["k"]) == full_text[: full_text.index(stop) + 2]


def test_min_tokens_holds_back_stop_tokens_and_strings(engine):
    reference = token_ids(run_all(engine, {"r": (PROMPT, greedy(8))})["r"])
    first = reference[0]
    held = greedy(8, stop_token_ids=[first], min_tokens=3)
    ids = token_ids(run_all(engine, {"m": (PROMPT, held)})["m"])
    # The first token would have ended it at once: masked until three tokens exist.
    assert len(ids) >= 3 and first not in ids[:3]
    text = engine.tokenizer.decode(reference[:1])
    if text.strip():  # a stop string the first token spells is not matched before 3 either
        ids = token_ids(run_all(engine, {"s": (PROMPT, greedy(8, stop=[text], min_tokens=3))})["s"])
        assert len(ids) >= 3


def test_stop_token_ids_and_eos(engine):
    reference = token_ids(run_all(engine, {"r": (PROMPT, greedy(8))})["r"])
    stop_at = reference[3]
    outputs = run_all(engine, {"s": (PROMPT, greedy(8, stop_token_ids=[stop_at]))})["s"]
    ids = token_ids(outputs)
    assert ids == reference[: reference.index(stop_at) + 1]
    assert outputs[-1].finish_reason == "stop"
    engine.eos_token_ids.add(stop_at)
    try:
        eos = SamplingParams(temperature=0.0, max_tokens=8)
        assert token_ids(run_all(engine, {"e": (PROMPT, eos)})["e"]) == ids
        ignored = token_ids(run_all(engine, {"i": (PROMPT, greedy(8))})["i"])
        assert ignored == reference
    finally:
        engine.eos_token_ids.discard(stop_at)


def test_generation_stops_at_max_model_len(engine):
    outputs = run_all(engine, {"m": (list(range(1, 61)), greedy(50))})["m"]
    assert len(token_ids(outputs)) == 4 and outputs[-1].finish_reason == "length"


def test_abort_finishes_with_abort_and_frees_pages(engine):
    engine.add_request("a", PROMPT, greedy(30))
    engine.add_request("w", PROMPT, greedy(30))
    engine.step()
    assert engine.abort("a") and engine.abort("w")
    assert not engine.abort("unknown")
    final = engine.step()
    assert {(o.request_id, o.finish_reason, o.finished) for o in final} == {
        ("a", "abort", True),
        ("w", "abort", True),
    }
    assert engine.blocks.num_used == 0 and not engine.has_unfinished()


def test_a_stop_tokens_text_is_left_out_unless_asked_for(engine):
    """Like vLLM: the token that stops an answer ends it without being in its text (EOS
    would otherwise read `</s>` when special tokens are kept), unless
    include_stop_str_in_output."""
    reference = token_ids(run_all(engine, {"r": (PROMPT, greedy(8))})["r"])
    stop_at = reference[3]
    cut = reference.index(stop_at)
    for keep_specials in (True, False):
        params = greedy(8, stop_token_ids=[stop_at], skip_special_tokens=keep_specials)
        text = "".join(o.new_text for o in run_all(engine, {"s": (PROMPT, params)})["s"])
        assert text == engine.tokenizer.decode(reference[:cut]), keep_specials
    asked = greedy(8, stop_token_ids=[stop_at], include_stop_str_in_output=True)
    text = "".join(o.new_text for o in run_all(engine, {"i": (PROMPT, asked)})["i"])
    assert text == engine.tokenizer.decode(reference[: cut + 1])
