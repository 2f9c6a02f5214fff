"""Sampling: seeds, argmax, top-k / top-p, penalties, logprobs."""

from __future__ import annotations

import math

import pytest
import torch

from llm_svc.engine import SamplingParams
from llm_svc.engine.errors import InvalidRequestError
from llm_svc.engine.sampling import apply_penalties, min_p_filter, top_k_filter, top_p_filter
from llm_svc.engine.sequence import Sequence
from tests.llm_svc.conftest import greedy, make_engine, run_all, token_ids

PROMPT = list(range(5, 17))


@pytest.fixture(scope="module")
def engine(llama_dir):
    return make_engine(llama_dir)


def test_seeded_sampling_is_reproducible_whatever_the_batch(engine):
    params = SamplingParams(temperature=1.0, top_p=0.9, seed=1234, max_tokens=12, ignore_eos=True)
    alone = run_all(engine, {"a": (PROMPT, params)})
    crowd = {f"n{i}": ([3 + i] * 7, SamplingParams(max_tokens=5, seed=i)) for i in range(4)}
    crowd["b"] = (PROMPT, params)
    together = run_all(engine, crowd)
    assert token_ids(alone["a"]) == token_ids(together["b"])
    other_seed = SamplingParams(temperature=1.0, seed=99, max_tokens=12, ignore_eos=True)
    assert token_ids(run_all(engine, {"c": (PROMPT, other_seed)})["c"]) != token_ids(alone["a"])


def test_top_k_one_is_greedy(engine):
    sampled = SamplingParams(temperature=0.8, top_k=1, max_tokens=8, ignore_eos=True, seed=3)
    outputs = run_all(engine, {"g": (PROMPT, greedy(8)), "k": (PROMPT, sampled)})
    assert token_ids(outputs["g"]) == token_ids(outputs["k"])


def test_logprobs_are_the_raw_distribution(engine):
    outputs = run_all(engine, {"l": (PROMPT, greedy(4, logprobs=3))})
    logprobs = [lp for out in outputs["l"] for lp in out.new_logprobs]
    assert [lp.token_id for lp in logprobs] == token_ids(outputs["l"])
    for entry in logprobs:
        assert len(entry.top) == 3
        assert entry.top[0] == (entry.token_id, pytest.approx(entry.logprob))  # greedy = top-1
        assert entry.top[0][1] >= entry.top[1][1] >= entry.top[2][1]
        assert entry.logprob <= 0 and math.isfinite(entry.logprob)


def test_top_p_keeps_the_smallest_nucleus():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]])).repeat(2, 1)
    kept = top_p_filter(logits, torch.tensor([0.75, 0.1]))
    assert torch.isfinite(kept).tolist() == [
        [True, True, False, False],
        [True, False, False, False],
    ]
    kept = top_k_filter(logits, torch.tensor([3, 1]), widest=3)
    assert torch.isfinite(kept).tolist() == [[True, True, True, False], [True, False, False, False]]


def test_min_p_drops_what_is_less_likely_than_its_share_of_the_top_token():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]])).repeat(3, 1)
    kept = min_p_filter(logits, torch.tensor([0.0, 0.5, 0.25]))
    assert torch.isfinite(kept).tolist() == [
        [True, True, True, True],
        [True, True, False, False],  # 0.15 < 0.5 * 0.5
        [True, True, True, False],  # 0.05 < 0.25 * 0.5 <= 0.15
    ]


@pytest.mark.parametrize("value", [-0.1, 1.5, float("nan")])
def test_min_p_outside_zero_one_is_refused_naming_it(value):
    with pytest.raises(InvalidRequestError) as info:
        SamplingParams(min_p=value).validate(vocab_size=100)
    assert "min_p" in str(info.value) and "[0, 1]" in str(info.value)


def test_penalties_follow_their_definitions():
    params = SamplingParams(repetition_penalty=2.0, frequency_penalty=0.5, presence_penalty=0.25)
    seq = Sequence("p", [0, 1, 1_000_000], params)  # a sentinel id is no token to penalise
    seq.append_token(2)
    seq.append_token(2)
    row = apply_penalties(torch.tensor([[1.0, -1.0, 4.0, 3.0]]), [seq])[0]
    # token 0: prompt only → 1/2; token 1: prompt only → -1*2; token 2: seen twice in output
    # → 4/2 - 2*0.5 - 0.25; token 3: untouched.
    assert row.tolist() == pytest.approx([0.5, -2.0, 0.75, 3.0])


def test_repetition_penalty_changes_greedy_output(engine):
    plain = run_all(engine, {"p": (PROMPT, greedy(12))})
    penalised = run_all(engine, {"q": (PROMPT, greedy(12, repetition_penalty=5.0))})
    ids = token_ids(penalised["q"])
    assert ids != token_ids(plain["p"])
    # With a strong penalty nothing from the prompt or earlier output is picked again soon.
    assert len(set(ids)) == len(ids)
