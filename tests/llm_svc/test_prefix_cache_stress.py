"""A randomized stress of the prefix cache, seeded: requests over shared prefixes arrive
while others run, on pools small enough that cached pages are evicted and running sequences
preempted, some aborted at random, with overlap scheduling off and on and a chunk budget
drawn from 1 to 13 tokens. Five families: Llama (full attention), Gemma 3 text (a window
pool beside the full one), Gemma 4 text (the two pools of different page shapes, and layers
reading others' KV), Qwen3-MoE (every layer slides) and Qwen3.5 (hybrid, a state snapshot
every 2 pages). Greedy tokens must equal a run of each request alone without a
cache (an aborted one's, a prefix of them), and at the end no sequence holds a page, a
window page or a state slot, and the cache, dropped, gives every one back. Then the same
with the host KV tier on (two rounds a family, the tier a few pools' worth, or a quarter of
one), whose units are copied back on hits: also none of its slots is held at the end."""

from __future__ import annotations

import random
import zlib

import pytest
import torch

from llm_svc.engine import EngineConfig, LLMEngine, SamplingParams
from llm_svc.engine.attention import KVCache
from llm_svc.engine.host_tier import KINDS
from llm_svc.engine.kv_events import BlockRemoved, WindowRemoved
from llm_svc.engine.kv_sizing import KindPages
from llm_svc.engine.models.config import FULL, SLIDING, TextModelConfig
from llm_svc.engine.window_pages import WindowNeed
from tests.llm_svc.checkpoints import tiny_checkpoint
from tests.llm_svc.family_checkpoints import family_checkpoint

PAGE = 4
MAX_LEN = 48
MAX_NEW = 12
REQUESTS = 12
ROUNDS = 4  # overlap off, on, off, ...: each round a new engine, chunk budget and pool
STEP_LIMIT = 2000  # far more than a round takes: running out of them means a hang
CHECKPOINTS = {
    "llama": lambda: tiny_checkpoint("llama"),
    "gemma3_text": lambda: family_checkpoint("gemma3_text"),
    # Layers of two KV shapes, the last two reading earlier layers' KV (no pages of theirs).
    "gemma4_text": lambda: family_checkpoint("gemma4_text"),
    "qwen3_moe": lambda: family_checkpoint("qwen3_moe"),
    "qwen3_5": lambda: tiny_checkpoint("qwen3_5"),
}


def _config(model_dir, **overrides) -> EngineConfig:
    args = dict(page_size=PAGE, max_num_seqs=4, max_model_len=MAX_LEN, device="cpu",
                dtype="float32", state_snapshot_interval=2)  # fmt: skip
    return EngineConfig(model_dir, **(args | overrides))


def _pool_args(model_dir, chunk: int, rng: random.Random) -> dict:
    """Pools that hold one sequence of MAX_LEN and at most half another: a byte budget
    split between the two pools for a sliding model (`num_pages` would bypass the split),
    else a page count."""
    mc = TextModelConfig.from_model_dir(model_dir)
    sliding = sum(kind == SLIDING for kind in (mc.layer_types or ()))
    if not sliding or mc.is_hybrid:
        return dict(num_pages=rng.randint(MAX_LEN // PAGE, 3 * MAX_LEN // PAGE // 2))

    def kind_bytes(kind: str) -> int:  # the layers that keep KV, at their kind's shape
        shape = mc.kv_shape(kind)
        layer = KVCache.bytes_per_page(1, PAGE, shape.num_kv_heads, shape.head_dim, torch.float32)
        return len(mc.kv_layers(kind)) * layer

    pages = KindPages(
        kind_bytes(FULL), kind_bytes(SLIDING), WindowNeed(mc.sliding_window, PAGE, chunk)
    )
    return dict(kv_cache_bytes=int(pages.bytes_alone(MAX_LEN) * rng.uniform(1.0, 1.5)))


def _requests(rng: random.Random, vocab: int) -> list[tuple[list[int], int]]:
    """(prompt, max_tokens) pairs: most continue one of three shared prefixes, cut at any
    point (inside pages and snapshot intervals too), with a suffix of their own."""
    prefixes = [[rng.randrange(3, vocab) for _ in range(24)] for _ in range(3)]
    requests = []
    for _ in range(REQUESTS):
        new = rng.randint(1, MAX_NEW)
        head = rng.choice(prefixes)[: rng.randint(0, 24)] if rng.random() < 0.85 else []
        tail = [rng.randrange(3, vocab) for _ in range(rng.randint(1, 10))]
        prompt = (head + tail)[: MAX_LEN - new]
        requests.append((prompt, new))
    return requests


class Alone:
    """Each prompt's greedy tokens, run alone on an engine without a prefix cache."""

    def __init__(self, model_dir) -> None:
        self.engine = LLMEngine(_config(model_dir, num_pages=64, enable_prefix_caching=False))
        self.tokens: dict[tuple[int, ...], list[int]] = {}

    def __call__(self, prompt: list[int]) -> list[int]:
        key = tuple(prompt)
        if key not in self.tokens:
            self.engine.add_request("alone", prompt, _greedy(MAX_NEW))
            tokens = []
            while self.engine.has_unfinished():
                tokens += [t for out in self.engine.step() for t in out.new_token_ids]
            self.tokens[key] = tokens
        return self.tokens[key]


def _greedy(max_tokens: int) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)


def _run(engine: LLMEngine, requests, rng: random.Random) -> tuple[dict, set]:
    """Add the requests a few steps apart, abort some at random; returns each request's
    tokens and the ids of those aborted."""
    tokens = {str(i): [] for i in range(len(requests))}
    aborted, added = set(), 0
    for _ in range(STEP_LIMIT):
        while added < len(requests) and rng.random() < 0.4:
            prompt, new = requests[added]
            engine.add_request(str(added), prompt, _greedy(new))
            added += 1
        if len(aborted) < 2 and engine.requests and rng.random() < 0.04:
            victim = rng.choice(sorted(engine.requests))
            engine.abort(victim)
            aborted.add(victim)
        if added == len(requests) and not engine.has_unfinished():
            return tokens, aborted
        for out in engine.step():
            tokens[out.request_id] += out.new_token_ids
    raise AssertionError(f"not done in {STEP_LIMIT} steps: {sorted(engine.requests)}")


def _pool_bytes(model_dir, pool: dict, chunk: int) -> int:
    """What the device pools of `pool` take (the host tier is sized against it)."""
    probe = LLMEngine(_config(model_dir, max_num_batched_tokens=chunk, **pool))
    runner = probe.runner
    tensors = [runner.kv_cache.k, runner.kv_cache.v]
    if runner.window_cache is not None:
        tensors += [runner.window_cache.k, runner.window_cache.v]
    if runner.state_pool is not None:
        tensors += [runner.state_pool.conv, runner.state_pool.recurrent]
    probe.close()
    return sum(t.numel() * t.element_size() for t in tensors)


def _assert_each_equals_alone(alone: Alone, requests, tokens: dict, aborted: set, where) -> None:
    """Each request's greedy tokens equal its run alone (an aborted one's, a prefix)."""
    for index, (prompt, new) in enumerate(requests):
        want = alone(prompt)[:new]
        got = tokens[str(index)]
        if str(index) in aborted:
            want = want[: len(got)]
        assert got == want, (*where, index)


def _assert_nothing_held(engine: LLMEngine) -> None:
    blocks = engine.blocks
    windows, states = blocks.windows, blocks.states
    assert blocks.num_used == 0
    if windows is not None:
        assert windows.num_used == 0
    if states is not None:
        assert states.num_free_running == states.running_slots
    # What stays is cached and nobody's: dropped, every page and slot is free again.
    engine.reset_prefix_cache()
    assert sorted(blocks.free_pages) == list(range(blocks.num_pages))
    if windows is not None:
        assert sorted(windows.free_pages) == list(range(1, windows.num_pages))
    if states is not None:
        assert states.num_free_snapshots == states.snapshot_slots
    tier = engine.runner.host_tier
    if tier is not None:
        assert all(tier.used(kind) == 0 for kind in KINDS)
        assert blocks.cache.num_nodes == 0


@pytest.mark.parametrize("family", sorted(CHECKPOINTS))
def test_random_requests_over_shared_prefixes_equal_each_run_alone(family):
    rng = random.Random(zlib.crc32(family.encode()))
    model_dir = CHECKPOINTS[family]()
    alone = Alone(model_dir)
    vocab = min(alone.engine.model_config.vocab_size, 300)
    preemptions = evictions = 0
    for round_ in range(ROUNDS):
        overlap = bool(round_ % 2)
        chunk = rng.randint(1, 13)
        config = _config(model_dir, max_num_batched_tokens=chunk, overlap_scheduling=overlap,
                         **_pool_args(model_dir, chunk, rng))  # fmt: skip
        engine = LLMEngine(config, tokenizer=alone.engine.tokenizer)
        requests = _requests(rng, vocab)
        tokens, aborted = _run(engine, requests, rng)
        _assert_each_equals_alone(
            alone, requests, tokens, aborted, (family, round_, overlap, chunk)
        )
        preemptions += engine.stats().preemptions
        events = engine.take_kv_events()
        evictions += sum(isinstance(e, (BlockRemoved, WindowRemoved)) for e in events)
        _assert_nothing_held(engine)
        engine.close()
    # The draw did stress what it is meant to.
    assert preemptions > 0 and evictions > 0, (preemptions, evictions)
    alone.engine.close()


@pytest.mark.parametrize("family", sorted(CHECKPOINTS))
def test_random_requests_with_the_host_tier_equal_each_run_alone(family):
    rng = random.Random(zlib.crc32(b"host " + family.encode()))
    model_dir = CHECKPOINTS[family]()
    alone = Alone(model_dir)
    vocab = min(alone.engine.model_config.vocab_size, 300)
    host_hits = 0
    for round_ in range(2):
        chunk = rng.randint(1, 13)
        pool = _pool_args(model_dir, chunk, rng)
        # Round 0: room for every unit; round 1: a quarter of the device pools' bytes, so
        # the tier drops units while loads and saves go on.
        factor = 3.0 if round_ == 0 else 0.25
        host = int(_pool_bytes(model_dir, pool, chunk) * factor)
        config = _config(model_dir, max_num_batched_tokens=chunk, overlap_scheduling=bool(round_),
                         host_kv_bytes=host, **pool)  # fmt: skip
        engine = LLMEngine(config, tokenizer=alone.engine.tokenizer)
        requests = _requests(rng, vocab)
        tokens, aborted = _run(engine, requests, rng)
        _assert_each_equals_alone(alone, requests, tokens, aborted, (family, round_, chunk))
        host_hits += sum(engine.runner.host_tier.stats.hits.values())
        _assert_nothing_held(engine)
        engine.close()
    assert host_hits > 0  # units did come back from host memory
    alone.engine.close()
