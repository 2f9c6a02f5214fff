"""The host KV tier (llm_svc/engine/host_tier.py): a conversation's pages, pushed off a
device pool of a few pages by other requests, are saved to host memory and copied back on
its next turn, and the greedy tokens equal a cold prefill's in float32: Llama (full
attention), Qwen3-MoE (every layer slides: window pages only), Gemma 3 text (window pages
beside full ones), Gemma 4 text (pools of two page shapes, KV-shared layers), Qwen3.5
(state snapshots with their pages), Qwen3-VL with an image, and Llama under tensor
parallelism 2 (each rank tiers its own heads, from rank 0's journal). Then the faults: a
copy back that fails drops the unit and its tokens are prefilled; a full host tier drops
its oldest units, never blocks; a budget the host cannot hold is refused."""

from __future__ import annotations

import pytest

from llm_svc import LLM
from llm_svc.engine import EngineConfig, LLMEngine
from llm_svc.engine.host_tier import KINDS, PAGE
from llm_svc.engine.kv_events import BlockRemoved
from tests.llm_svc.checkpoints import tiny_checkpoint
from tests.llm_svc.conftest import greedy, run_all, token_ids
from tests.llm_svc.family_checkpoints import family_checkpoint
from tests.llm_svc.mm_reference import MMReference, make_image, same_tokens

PAGE_SIZE, NEW = 4, 6
HOST_BYTES = 4 << 20  # far more than the tiny pools: the tier never drops a unit
CHECKPOINTS = {
    "llama": lambda: tiny_checkpoint("llama"),
    "qwen3_moe": lambda: family_checkpoint("qwen3_moe"),
    "gemma3_text": lambda: family_checkpoint("gemma3_text"),
    "gemma4_text": lambda: family_checkpoint("gemma4_text"),
    "qwen3_5": lambda: tiny_checkpoint("qwen3_5"),
}


def _engine(model_dir, **overrides) -> LLMEngine:
    args = dict(page_size=PAGE_SIZE, num_pages=12, max_num_seqs=2, max_model_len=44,
                dtype="float32", device="cpu", state_snapshot_interval=2,
                max_num_batched_tokens=16, host_kv_bytes=HOST_BYTES)  # fmt: skip
    return LLMEngine(EngineConfig(model_dir, **(args | overrides)))


def _turns(engine: LLMEngine) -> tuple[list[int], list[int], list[list[int]]]:
    """A first turn, its next turn (the first's prompt and more), and three other prompts
    that together need every device page."""
    vocab = min(engine.model_config.vocab_size, 300)
    first = [(7 * i + 3) % vocab for i in range(26)]
    others = [[(11 * i + 5 * k + 1) % vocab for i in range(30)] for k in range(3)]
    return first, first + [(13 * i + 2) % vocab for i in range(6)], others


def _host_hit(engine: LLMEngine) -> tuple[list[int], int]:
    """Runs the first turn, the other prompts (its pages leave the device), then the next
    turn; returns the next turn's tokens and the prompt tokens it had cached."""
    first, second, others = _turns(engine)
    run_all(engine, {"first": (first, greedy(NEW))})
    for index, prompt in enumerate(others):
        run_all(engine, {f"other{index}": (prompt, greedy(NEW))})
    assert not any(isinstance(event, BlockRemoved) for event in engine.take_kv_events()), (
        "a page left the tree: the host tier should have kept it"
    )
    out = run_all(engine, {"second": (second, greedy(NEW))})["second"]
    return token_ids(out), out[-1].num_cached_tokens


def _cold(model_dir, prompt: list[int], **overrides) -> list[int]:
    engine = _engine(model_dir, enable_prefix_caching=False, num_pages=32, host_kv_bytes=0,
                     **overrides)  # fmt: skip
    try:
        return token_ids(run_all(engine, {"cold": (prompt, greedy(NEW))})["cold"])
    finally:
        engine.close()


@pytest.mark.parametrize("family", sorted(CHECKPOINTS))
def test_a_host_tier_hit_equals_a_cold_prefill(family):
    model_dir = CHECKPOINTS[family]()
    engine = _engine(model_dir)
    try:
        tokens, cached = _host_hit(engine)
        stats = engine.runner.host_tier.stats
        second = _turns(engine)[1]
    finally:
        engine.close()
    assert stats.page_lookups["host"] > 0 and stats.hits[PAGE] > 0, stats
    assert cached >= stats.page_lookups["host"] * PAGE_SIZE > 0
    if family == "qwen3_5":
        assert stats.hits["state"] > 0  # it resumed from a snapshot that was in host memory
    if family in ("gemma3_text", "qwen3_moe"):
        assert stats.hits["window"] > 0
    assert tokens == _cold(model_dir, second)


def test_a_host_tier_hit_equals_a_cold_prefill_under_tensor_parallelism():
    model_dir = tiny_checkpoint("llama")
    engine = _engine(model_dir, tensor_parallel_size=2)
    try:
        tokens, _ = _host_hit(engine)
        assert engine.runner.host_tier.stats.hits[PAGE] > 0
        second = _turns(engine)[1]
    finally:
        engine.close()
    assert tokens == _cold(model_dir, second)


def test_a_host_tier_hit_over_an_image_equals_hf(tiny_qwen3_vl_dir):
    reference = MMReference(tiny_qwen3_vl_dir)
    image = make_image(0)
    first = reference.prompt(["Describe", "please"], [image])
    second = reference.prompt(["Describe", "please, and say more about its colours"], [image])
    others = [reference.prompt([f"Tell me {k}", "now"], [make_image(k + 1)]) for k in range(3)]
    longest = max(len(p.expanded) for p in [second, *others]) + NEW
    # One request's pages and two more: each other prompt pushes the first off the device.
    llm = LLM(reference.model_dir, page_size=PAGE_SIZE, num_pages=-(-longest // PAGE_SIZE) + 2,
              max_model_len=longest, max_num_seqs=1, max_num_batched_tokens=512,
              host_kv_bytes=64 << 20)  # fmt: skip
    params = greedy(NEW)
    for prompt in [first, *others]:
        llm.generate(prompt_token_ids=[prompt.ids], images=[prompt.images],
                     sampling_params=params, use_tqdm=False)  # fmt: skip
    out = llm.generate(prompt_token_ids=[second.ids], images=[second.images],
                       sampling_params=params, use_tqdm=False)[0]  # fmt: skip
    stats = llm.engine.runner.host_tier.stats
    assert stats.page_lookups["host"] > 0
    assert out.num_cached_tokens > max(end for _, end in second.items[0].offsets)
    assert same_tokens(out.token_ids, reference.greedy(second, NEW))


def test_a_failed_copy_back_drops_the_unit_and_prefills():
    model_dir = tiny_checkpoint("llama")
    engine = _engine(model_dir)
    try:
        engine.runner.host_tier.fail_loads = 1
        tokens, cached = _host_hit(engine)
        stats = engine.runner.host_tier.stats
        removed = [e for e in engine.take_kv_events() if isinstance(e, BlockRemoved)]
        second = _turns(engine)[1]
    finally:
        engine.close()
    assert stats.load_failures == 1 and stats.hits[PAGE] == 0
    assert removed, "the unit whose copy failed (and what hangs under it) left the tree"
    assert cached == stats.page_lookups["device"] * PAGE_SIZE  # only what the device held
    assert tokens == _cold(model_dir, second)


def test_a_full_host_tier_drops_its_oldest_units_and_never_blocks():
    model_dir = tiny_checkpoint("llama")
    probe = _engine(model_dir, host_kv_bytes=0)
    page_bytes = probe.runner.kv_bytes_per_page()
    probe.close()
    engine = _engine(model_dir, host_kv_bytes=3 * page_bytes * 12 // 12)  # three pages
    try:
        tier = engine.runner.host_tier
        assert tier.capacity[PAGE] == 3
        first, second, others = _turns(engine)
        for index, prompt in enumerate([first, *others, second, *others]):
            out = run_all(engine, {str(index): (prompt, greedy(NEW))})[str(index)]
            assert len(token_ids(out)) == NEW
        assert tier.used(PAGE) <= 3
        removed = [e for e in engine.take_kv_events() if isinstance(e, BlockRemoved)]
        assert removed  # pages left their last tier
        engine.reset_prefix_cache()
        assert all(tier.used(kind) == 0 for kind in KINDS)
        assert engine.blocks.cache.num_nodes == 0
    finally:
        engine.close()


def test_a_budget_the_host_cannot_hold_is_refused_by_name():
    with pytest.raises(ValueError, match="IRIS_LLM_HOST_KV_BYTES 1125899906842624 is more"):
        _engine(tiny_checkpoint("llama"), host_kv_bytes=1 << 50)
    with pytest.raises(ValueError, match="IRIS_LLM_HOST_KV_BYTES 100 holds not one page"):
        _engine(tiny_checkpoint("llama"), host_kv_bytes=100)
