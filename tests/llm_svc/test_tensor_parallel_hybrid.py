"""Qwen3.5's hybrid decoder under tensor parallelism on the CPU, with real rank processes
(gloo, two ranks), in float32: TP 2 gives HF's greedy tokens and log-probs (within 1e-4),
as TP 1 does, through one run that holds three sequences prefilled in chunks and decoded
together, one of them preempted (too few pages), then a request that resumes from a state
snapshot (a prefix hit) on every rank.
Each rank holds its own heads' states (half the key and value heads: the tiny model has 2
and 4) in a pool of its own, with the same slots as rank 0's."""

from __future__ import annotations

import pytest

from llm_svc.engine import EngineConfig, LLMEngine
from llm_svc.engine.parallel.checks import check_tensor_parallel
from tests.llm_svc.checkpoints import tiny_checkpoint
from tests.llm_svc.conftest import greedy, run_all, token_ids
from tests.llm_svc.test_qwen3_5 import PROMPTS, HFGreedy

PAGE, K, CHUNK, NEW = 4, 2, 5, 6  # a snapshot every 2 pages = 8 tokens
PAGES = 9  # too few for the three first requests at once: one is preempted


@pytest.fixture(scope="module")
def model_dir():
    return tiny_checkpoint("qwen3_5")


def _run(model_dir, size: int):
    """(the outputs of the three first requests then of the prefix hit, their prompts, the
    preemptions counted, the runner's pool shapes)."""
    config = EngineConfig(
        model_dir, page_size=PAGE, state_snapshot_interval=K, max_num_batched_tokens=CHUNK,
        num_pages=PAGES, max_num_seqs=4, dtype="float32", device="cpu",
        tensor_parallel_size=size,
    )  # fmt: skip
    engine = LLMEngine(config)
    try:
        texts = [PROMPTS[1], PROMPTS[1] + " and then", PROMPTS[0]]
        prompts = [engine.tokenizer(text)["input_ids"] for text in texts]
        params = greedy(NEW, logprobs=0)
        first = run_all(engine, {str(i): (ids, params) for i, ids in enumerate(prompts)})
        preemptions = engine.stats().preemptions
        # 11 tokens of the last prompt, then others: resumes from the snapshot at 8.
        other = engine.tokenizer(" 0123456789 + - = ? !")["input_ids"]
        prompts.append(prompts[2][:11] + other)
        hit = run_all(engine, {"hit": (prompts[3], params)})["hit"]
        pool = engine.runner.state_pool
        shapes = (tuple(pool.conv.shape), tuple(pool.recurrent.shape))
    finally:
        engine.close()
    return [first["0"], first["1"], first["2"], hit], prompts, preemptions, shapes


@pytest.fixture(scope="module")
def runs(model_dir):
    return {size: _run(model_dir, size) for size in (1, 2)}


def _logprobs(outputs) -> list[float]:
    return [entry.logprob for out in outputs for entry in out.new_logprobs]


def test_tp2_equals_hf_and_tp1_with_a_prefix_hit_from_a_snapshot(model_dir, runs):
    hf = HFGreedy(model_dir)
    for size, (outputs, prompts, preemptions, _) in runs.items():
        for index, (prompt, outs) in enumerate(zip(prompts, outputs, strict=True)):
            tokens, logprobs = hf(prompt, NEW)
            assert token_ids(outs) == tokens, f"TP {size} request {index}"
            assert _logprobs(outs) == pytest.approx(logprobs, abs=1e-4), f"TP {size} {index}"
        assert preemptions > 0  # a running slot given back, and reset when it is taken again
        assert outputs[-1][-1].num_cached_tokens == 2 * PAGE  # resumed from the snapshot at 8


def test_each_rank_holds_its_heads_states(runs):
    (conv1, rec1), (conv2, rec2) = runs[1][3], runs[2][3]
    # [layers, slots, channels, kernel - 1] and [layers, slots, value heads, dk, dv].
    assert conv2[:2] == conv1[:2] and rec2[:2] == rec1[:2]  # the same slots
    assert conv2[2] * 2 == conv1[2] and rec2[2] * 2 == rec1[2]
    assert conv2[3:] == conv1[3:] and rec2[3:] == rec1[3:]


def test_a_size_that_does_not_divide_the_linear_key_heads_is_refused(model_dir):
    # 4 ranks divide the 4 attention heads and are a multiple of the 2 KV heads.
    with pytest.raises(ValueError, match="does not divide the model's 2 linear-attention key"):
        check_tensor_parallel(model_dir, 4, "cpu")
