"""Sizing a model with sliding layers (docs/design/engine.md "Pages per layer kind", rules (a)
and (b)): a byte budget that cannot hold one `max_model_len` sequence in both pools is
refused at start, or lowers an unset `max_model_len` to what fits; a sequence that cannot
take its whole chunk beside older ones takes what the pools hold instead of waiting. The
tiny Gemma 3 text checkpoint (window 8; layers sliding, sliding, full), pages of 4 tokens,
chunks of 8: one sequence of 64 tokens needs 16 full-layer pages and 6 window pages (its
window of 3, a chunk of 2, the null page), each window page worth two full-layer ones."""

from __future__ import annotations

import logging

import pytest
import torch

from llm_svc.engine import EngineConfig, InvalidRequestError, LLMEngine, SamplingParams
from llm_svc.engine.attention import KVCache
from llm_svc.engine.errors import RequestTooLargeError
from llm_svc.engine.models.config import TextModelConfig
from llm_svc.engine.validation import check_request
from llm_svc.engine.window_pages import WindowNeed
from tests.llm_svc.conftest import token_ids
from tests.llm_svc.family_checkpoints import family_checkpoint

PAGE, CHUNK, MAX_LEN = 4, 8, 64
# Steps a request of this file needs many times over: a loop that runs out of them hangs.
STEP_LIMIT = 200


@pytest.fixture(scope="module")
def model_dir():
    return family_checkpoint("gemma3_text")


def _layer_page_bytes(model_dir) -> int:
    """One page of one layer's K and V in float32."""
    mc = TextModelConfig.from_model_dir(model_dir)
    return KVCache.bytes_per_page(1, PAGE, mc.num_kv_heads, mc.head_dim, torch.float32)


def _engine(model_dir, pages: int, **extra) -> LLMEngine:
    """An engine whose KV budget is `pages` full-layer pages (`kv_cache_bytes`: `num_pages`
    would bypass the split)."""
    args = dict(page_size=PAGE, max_num_batched_tokens=CHUNK, max_num_seqs=4, device="cpu",
                dtype="float32", kv_cache_bytes=pages * _layer_page_bytes(model_dir))  # fmt: skip
    return LLMEngine(EngineConfig(model_dir, **dict(args, **extra)))


def _greedy(max_tokens: int) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)


def _run_bounded(engine: LLMEngine, requests: dict, chunks: list | None = None) -> dict:
    """Add the requests, step until none is left, and fail (rather than hang) after
    STEP_LIMIT steps; `chunks` collects every scheduled chunk as (request, size, wanted),
    wanted being what its sequence had left and the step's budget allowed."""
    for request_id, (ids, params) in requests.items():
        engine.add_request(request_id, ids, params)
    if chunks is not None:
        schedule = engine.scheduler.schedule

        def recording():
            out = schedule()
            used = 0
            for chunk in out.chunks:
                left = chunk.seq.num_tokens - chunk.start
                wanted = min(left, CHUNK - used)
                chunks.append((chunk.seq.request_id, chunk.num_tokens, wanted))
                used += chunk.num_tokens
            return out

        engine.scheduler.schedule = recording
    outputs = {request_id: [] for request_id in requests}
    for _ in range(STEP_LIMIT):
        if not engine.has_unfinished():
            return outputs
        for out in engine.step():
            outputs[out.request_id].append(out)
    stuck = {rid: (s.num_computed_tokens, s.num_tokens) for rid, s in engine.requests.items()}
    raise AssertionError(f"no progress in {STEP_LIMIT} steps: {stuck}")


def test_a_budget_under_one_max_model_len_sequence_is_refused_naming_what_fits(model_dir):
    # 17 pages: 20 tokens (5 full pages) and 6 window pages of two layers each = 17.
    budget = 17 * _layer_page_bytes(model_dir)
    with pytest.raises(ValueError) as refused:
        _engine(model_dir, 17, max_model_len=MAX_LEN)
    message = str(refused.value)
    assert f"KV budget {budget} bytes" in message
    assert f"max_model_len {MAX_LEN}" in message
    assert "largest max_model_len that fits is 20" in message


def test_an_unset_max_model_len_becomes_the_largest_that_fits_with_a_warning(model_dir, caplog):
    with caplog.at_level(logging.WARNING, logger="llm_svc.engine.model_runner"):
        engine = _engine(model_dir, 17)
    assert engine.config.max_model_len == 20
    assert any("max_model_len" in r.message and "20" in r.message for r in caplog.records)
    with pytest.raises(InvalidRequestError, match="max_model_len 20"):
        engine.add_request("long", list(range(3, 27)), _greedy(4))
    # What the old split admitted and then never finished: a prompt past the window pool.
    outputs = _run_bounded(engine, {"fits": (list(range(3, 19)), _greedy(8))})
    assert len(token_ids(outputs["fits"])) == 20 - 16
    engine.close()


def test_a_sequence_short_of_its_chunk_beside_an_older_one_takes_what_the_pools_hold(
    model_dir,
):
    # 28 pages hold one sequence of 64 tokens and nothing more: 16 full pages, 6 window
    # pages. Beside a decoding sequence the window pool lacks a whole chunk.
    engine = _engine(model_dir, 28, max_model_len=MAX_LEN)
    assert (engine.runner.num_pages, engine.runner.num_window_pages) == (16, 6)
    requests = {
        "short": ([5, 9, 13], _greedy(20)),
        "long": ([(7 * i) % 50 + 3 for i in range(24)], _greedy(4)),
    }
    chunks = []
    outputs = _run_bounded(engine, requests, chunks)
    shrunk = [(size, wanted) for rid, size, wanted in chunks if rid == "long" and size < wanted]
    assert shrunk, chunks
    for request_id, (ids, params) in requests.items():
        alone = _engine(model_dir, 256, max_model_len=MAX_LEN, enable_prefix_caching=False)
        want = _run_bounded(alone, {request_id: (ids, params)})[request_id]
        assert token_ids(outputs[request_id]) == token_ids(want), request_id
        alone.close()
    windows = engine.blocks.windows
    assert windows.num_used == 0 and engine.blocks.num_used == 0
    engine.close()


def test_check_request_refuses_what_the_window_pool_cannot_hold_alone():
    need = WindowNeed(window=8, page_size=PAGE, chunk_tokens=CHUNK)
    # 40 tokens: a decode's window of 3 pages, a chunk of 2, the null page.
    assert need.pages(40) == 6
    # 6 tokens: its own 2 pages are all it can hold, and the null page.
    assert need.pages(6) == 3
    common = dict(vocab_size=100, max_model_len=MAX_LEN, page_size=PAGE, num_pages=16,
                  window_need=need)  # fmt: skip
    assert check_request([3] * 30, _greedy(10), num_window_pages=6, **common) == [3] * 30
    with pytest.raises(RequestTooLargeError, match="needs 6 .* window pool has 5"):
        check_request([3] * 30, _greedy(10), num_window_pages=5, **common)
