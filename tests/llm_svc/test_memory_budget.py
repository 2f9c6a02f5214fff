"""The memory budget (issue 35): its arithmetic against a fake device (no GPU here: the fake
stands in for torch's CUDA allocator statistics, which only a GPU has), the CPU accounting
against a configured budget on a real tiny model, the profiling step run for real on the
CPU, and admission waiting at the held-embedding limit on a real engine."""

from __future__ import annotations

import logging

import pytest
import torch

from llm_svc.engine import EngineConfig, LLMEngine
from llm_svc.engine.attention import KVCache
from llm_svc.engine.embeddings import EmbeddingSource
from llm_svc.engine.errors import InvalidRequestError
from llm_svc.engine.kv_sizing import profile_step
from llm_svc.engine.memory_budget import (
    MemoryBudget,
    ProfiledStep,
    estimated_step_peak,
    measured_budget,
    module_bytes,
    pages_across_ranks,
)
from llm_svc.engine.model_runner import ModelRunner
from llm_svc.engine.sequence import SequenceStatus
from tests.llm_svc.conftest import greedy
from tests.llm_svc.mm_reference import make_image

GIB = 1 << 30


class FakeProbe:
    """A device with `total` bytes, `weights` allocated, and `other` used outside torch;
    the profile callback allocates through `allocate` and frees through `free`."""

    def __init__(self, total: int, weights: int, other: int) -> None:
        self.total, self.allocated, self.other = total, weights, other
        self.peak = weights
        self.calls: list[str] = []

    def allocate(self, size: int) -> None:
        self.allocated += size
        self.peak = max(self.peak, self.allocated)

    def free(self, size: int) -> None:
        self.allocated -= size

    def total_bytes(self) -> int:
        return self.total

    def allocated_bytes(self) -> int:
        self.calls.append("allocated")
        return self.allocated

    def reset_peak(self) -> None:
        self.calls.append("reset_peak")
        self.peak = self.allocated

    def peak_bytes(self) -> int:
        self.calls.append("peak")
        return self.peak

    def other_bytes(self) -> int:
        return self.other


def test_budget_is_utilisation_times_total_less_weights_peak_held_and_other():
    probe = FakeProbe(total=80 * GIB, weights=10 * GIB, other=GIB // 2)
    probe.allocate(7 * GIB)  # left over from before the profile: must not count as peak
    probe.free(7 * GIB)

    def profile():
        probe.calls.append("profile")
        probe.allocate(3 * GIB)  # activations
        probe.allocate(GIB)  # sampler buffers, on top
        probe.free(4 * GIB)
        return ProfiledStep(tokens=8192, image_rows=8192, sampled_rows=256)

    budget = measured_budget(probe, 0.9, held_embeddings=2 * GIB, profile=profile, rank=1)
    assert probe.calls == ["allocated", "reset_peak", "profile", "peak"]
    assert (budget.weights, budget.step_peak, budget.other) == (10 * GIB, 4 * GIB, GIB // 2)
    expected = int(0.9 * 80 * GIB) - 10 * GIB - 4 * GIB - 2 * GIB - GIB // 2
    assert budget.kv_bytes == expected
    assert budget.num_pages(1 << 20) == expected >> 20


def test_the_profiles_own_kv_cache_and_image_rows_are_counted_once():
    """The profiling step allocates a KV cache for its tokens and the embeddings its image
    rows come from; the KV term and held embeddings count those, so the budget is the design's
    sum (docs/design/engine.md) with the step peak net of both (the old code subtracted them
    twice)."""
    total, weights, other, held = 80 * GIB, 10 * GIB, GIB // 2, 2 * GIB
    kv, images, activations, sampler = 6 * GIB, GIB, 3 * GIB, GIB
    probe = FakeProbe(total, weights, other)

    def profile():
        probe.allocate(kv)
        probe.allocate(images)
        probe.allocate(activations)
        probe.allocate(sampler)
        probe.free(kv + images + activations + sampler)
        return ProfiledStep(8192, 8192, 256, kv_bytes=kv, image_bytes=images)

    budget = measured_budget(probe, 0.9, held_embeddings=held, profile=profile)
    # docs/design/engine.md: KV = utilisation x total - weights - step peak - held - other,
    # step peak = allocator peak - weights - the profile's KV - its image rows.
    step_peak = (weights + kv + images + activations + sampler) - weights - kv - images
    expected = 0.9 * total - weights - step_peak - held - other
    assert budget.step_peak == activations + sampler
    assert abs(budget.kv_bytes - expected) <= 0.01 * expected


def test_the_profiling_step_reports_its_kv_cache_and_image_rows(llama_dir):
    config = EngineConfig(llama_dir, page_size=4, max_num_batched_tokens=50, max_num_seqs=6,
                          num_pages=8, device="cpu", dtype="float32")  # fmt: skip
    runner = ModelRunner(config)
    step = profile_step(runner, config)
    mc = runner.model_config
    pages = 14  # 50 tokens over 6 sequences of 9, 9, 8, 8, 8, 8: 3 + 3 + 2 + 2 + 2 + 2 pages
    per_page = KVCache.bytes_per_page(mc.num_layers, 4, mc.num_kv_heads, mc.head_dim,
                                      torch.float32)  # fmt: skip
    assert step.kv_bytes == pages * per_page
    assert step.image_bytes == 50 * mc.hidden_size * 4


def test_a_budget_too_small_for_one_page_names_every_part():
    budget = MemoryBudget(total=GIB, utilisation=0.75, weights=GIB // 4, step_peak=GIB // 4,
                          held_embeddings=GIB // 8, rank=3)  # fmt: skip
    assert budget.num_pages(GIB // 8) == 1
    with pytest.raises(ValueError, match="rank 3") as err:
        budget.num_pages(GIB // 8 + 1)
    for part in ("total 1024 MiB", "weights 256 MiB", "step peak 256 MiB", "held embeddings 128"):
        assert part in str(err.value)


def test_the_pod_gets_the_pages_of_its_tightest_rank():
    roomy = MemoryBudget(total=8 * GIB, utilisation=1.0, weights=GIB, step_peak=GIB,
                         held_embeddings=0, rank=0)  # fmt: skip
    tight = MemoryBudget(total=8 * GIB, utilisation=1.0, weights=GIB, step_peak=3 * GIB,
                         held_embeddings=0, rank=1)  # fmt: skip
    assert pages_across_ranks([roomy, tight], GIB) == 4  # 8 - 1 - 3 GiB


def test_cpu_accounting_runs_against_the_configured_budget(llama_dir, caplog):
    total = 64 << 20
    config = EngineConfig(llama_dir, page_size=4, max_num_batched_tokens=64, max_num_seqs=8,
                          memory_budget_bytes=total, device="cpu", dtype="float32")  # fmt: skip
    with caplog.at_level(logging.INFO, logger="llm_svc.engine.memory_budget"):
        runner = ModelRunner(config)
    mc = runner.model_config
    peak = estimated_step_peak(mc.hidden_size, mc.intermediate_size, mc.vocab_size, 64, 8,
                               torch.float32)  # fmt: skip
    per_page = KVCache.bytes_per_page(mc.num_layers, 4, mc.num_kv_heads, mc.head_dim,
                                      torch.float32)  # fmt: skip
    # A text model holds no image embeddings: that term is 0.
    assert runner.num_pages == (total - module_bytes(runner.model) - peak) // per_page
    logged = caplog.text
    for part in ("total 64 MiB", "weights", "step peak", "held embeddings 0 MiB", "= KV"):
        assert part in logged


def test_the_profiling_step_runs_the_largest_step(llama_dir):
    config = EngineConfig(llama_dir, page_size=4, max_num_batched_tokens=50, max_num_seqs=6,
                          num_pages=8, device="cpu", dtype="float32")  # fmt: skip
    runner = ModelRunner(config)
    backend = runner.backend
    step = profile_step(runner, config)
    assert (step.tokens, step.image_rows, step.sampled_rows) == (50, 50, 6)
    assert runner.backend is backend  # the runner's own backend is back


class MemorySource(EmbeddingSource):
    """Embeddings an encoder would store, served from memory (the cache service is not
    what these tests are about); counts what is held, as the real sources do."""

    def __init__(self, embeddings: dict[bytes, torch.Tensor]) -> None:
        self.embeddings = embeddings

    def fetch(self, items, hidden, dtype):
        return {index: self.embeddings[item.key].to(dtype) for index, item in items.items()}


@pytest.fixture(scope="module")
def image_prompts(qwen_reference):
    prompts = [qwen_reference.prompt(["Look", "here"], [make_image(80 + i)]) for i in range(3)]
    embeddings = {}
    for prompt in prompts:
        embeddings[prompt.items[0].key] = qwen_reference.embeddings(prompt.images)[0]
    return prompts, embeddings


def _run(qwen_reference, prompts, embeddings, limit, on_step=None):
    config = EngineConfig(qwen_reference.model_dir, page_size=4, max_num_batched_tokens=512,
                          num_pages=256, max_num_seqs=8, device="cpu", dtype="float32",
                          cache_address=None, max_held_embedding_bytes=limit)  # fmt: skip
    engine = LLMEngine(config, embedding_source=MemorySource(embeddings))
    for i, prompt in enumerate(prompts):
        engine.add_request(f"r{i}", prompt.padded, greedy(4), items=prompt.items)
    tokens = {f"r{i}": [] for i in range(len(prompts))}
    while engine.has_unfinished():
        for out in engine.step():
            tokens[out.request_id].extend(out.new_token_ids)
        if on_step is not None:
            on_step(engine)
    engine.close()
    return tokens, engine


def test_admission_waits_at_the_held_embedding_limit(qwen_reference, image_prompts):
    prompts, embeddings = image_prompts
    one = max(e.numel() * 4 for e in embeddings.values())  # fp32 rows of the largest image
    held_seen = []

    def watch(engine):
        fetcher = engine.fetcher
        held_seen.append(fetcher.held_bytes)
        assert fetcher.held_bytes <= one
        assert sum(len(s.embeddings) for s in engine.requests.values()) <= 1

    tokens, engine = _run(qwen_reference, prompts, embeddings, one, on_step=watch)
    assert engine.scheduler.num_held_embedding_waits > 0
    assert held_seen[-1] == 0 and engine.fetcher.held_bytes == 0  # all given back
    # The same requests without the limit produce the same tokens, all at once.
    free, _ = _run(qwen_reference, prompts, embeddings, 1 << 40)
    assert tokens == free and all(len(t) == 4 for t in tokens.values())


def test_waiting_requests_stay_queued_while_the_limit_is_reached(qwen_reference, image_prompts):
    prompts, embeddings = image_prompts
    one = max(e.numel() * 4 for e in embeddings.values())
    config = EngineConfig(qwen_reference.model_dir, page_size=4, num_pages=256, device="cpu",
                          dtype="float32", cache_address=None,
                          max_held_embedding_bytes=one)  # fmt: skip
    engine = LLMEngine(config, embedding_source=MemorySource(embeddings))
    seqs = [engine.add_request(f"r{i}", p.padded, greedy(2), items=p.items)
            for i, p in enumerate(prompts)]  # fmt: skip
    engine.step()  # the first starts its fetch; the others wait in the queue
    assert seqs[0].status is SequenceStatus.FETCHING
    assert [s.status for s in seqs[1:]] == [SequenceStatus.WAITING] * 2
    assert engine.fetcher.held_bytes == engine.fetcher.bytes_for(prompts[0].items)
    engine.close()


def test_a_request_whose_images_exceed_the_limit_is_refused(qwen_reference):
    prompt = qwen_reference.prompt(["Two", "and", "."], [make_image(90), make_image(91)])
    config = EngineConfig(qwen_reference.model_dir, page_size=4, num_pages=256, device="cpu",
                          dtype="float32", cache_address=None,
                          max_held_embedding_bytes=1000)  # fmt: skip
    engine = LLMEngine(config, embedding_source=MemorySource({}))
    with pytest.raises(InvalidRequestError, match="IRIS_LLM_MAX_HELD_EMBEDDING_BYTES") as err:
        engine.add_request("big", prompt.padded, greedy(2), items=prompt.items)
    assert "must be at most 1000" in str(err.value) and not engine.requests
    engine.close()
