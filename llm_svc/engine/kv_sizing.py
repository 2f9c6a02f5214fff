"""How many KV pages a model runner gets: the memory budget (memory_budget.py) with the step
peak profiled on CUDA, or estimated against the configured budget on the CPU; for a model
with sliding layers, how that budget splits into its two pools (`KindPages`)."""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch

from llm_svc.engine.config import DEFAULT_CPU_KV_BYTES, EngineConfig
from llm_svc.engine.embeddings.assembly import ChunkImageRows
from llm_svc.engine.memory_budget import (
    CudaProbe,
    MemoryBudget,
    ProfiledStep,
    estimated_step_peak,
    measured_budget,
    module_bytes,
)
from llm_svc.engine.sampling import Sampler
from llm_svc.engine.sampling_params import SamplingParams
from llm_svc.engine.scheduler import ScheduledChunk
from llm_svc.engine.sequence import Sequence
from llm_svc.engine.state_pool import StatePool
from llm_svc.engine.window_pages import WindowNeed, pages_per_sequence

log = logging.getLogger(__name__)

# The sampler's widest work per row: full-vocabulary sort (top-p alone), penalties over
# prompt and output, logprobs' log-softmax. Half the profile rows add top-k.
_WIDEST = dict(temperature=0.7, top_p=0.9, min_p=0.05, repetition_penalty=1.1,
               frequency_penalty=0.5, presence_penalty=0.5, logprobs=20)  # fmt: skip


@dataclass(frozen=True)
class KindPages:
    """The two pools of a model with sliding layers (docs/design/engine.md "Pages per layer
    kind"): a page of the full-attention layers costs `full_bytes` (0 when every layer
    slides: that pool then only keys the radix tree), a page of the sliding layers
    `window_bytes`, and one sequence needs of the latter what `need` says."""

    full_bytes: int
    window_bytes: int
    need: WindowNeed

    def pages_for(self, length: int) -> int:
        return -(-length // self.need.page_size)

    def bytes_alone(self, length: int) -> int:
        """What one sequence of `length` tokens needs to run alone: a full-layer page for
        each of its positions' pages, and `need.pages(length)` window pages."""
        full = self.full_bytes * self.pages_for(length)
        return full + self.window_bytes * self.need.pages(length)

    def longest(self, budget: int, limit: int) -> int:
        """The longest sequence, at most `limit` tokens, that runs alone in `budget` bytes
        (0 if none does)."""
        low, high = 0, limit
        while low < high:
            mid = (low + high + 1) // 2
            if self.bytes_alone(mid) <= budget:
                low = mid
            else:
                high = mid - 1
        return low

    def split(self, budget: int, length: int) -> tuple[int, int]:
        """(full pages, window pages) of `budget` bytes, which holds one sequence of
        `length` tokens alone (`longest` says so). That one first, then the rest as more
        such sequences need it, each decoding: P_L full pages and w window pages each, so
        m = rest / (f·P_L + s·w) more of them (a real number); the window pool gets
        `need.pages(length)` + ⌊m·w⌋ pages and the full pool the rest."""
        assert self.bytes_alone(length) <= budget, "the budget holds no sequence of length"
        seq_pages = self.pages_for(length)
        seq_window = pages_per_sequence(length, self.need.window, self.need.page_size)
        rest = budget - self.bytes_alone(length)
        more = rest * seq_window // (self.full_bytes * seq_pages + self.window_bytes * seq_window)
        num_window = self.need.pages(length) + more
        if not self.full_bytes:  # keys only: as many sequences' pages as the window pool holds
            return (1 + more // seq_window) * seq_pages, num_window
        return (budget - self.window_bytes * num_window) // self.full_bytes, num_window


def holds_images(runner) -> bool:
    """Whether the runner's model takes images (then embeddings may be held)."""
    from iris.models import has_adapter

    return has_adapter(runner.model_config.architecture)


def kv_budget(runner, config: EngineConfig, rank: int = 0) -> MemoryBudget:
    """`runner`'s budget (weights loaded, no KV yet), logged part by part. `rank`: which
    tensor-parallel rank this runner is (each measures its own)."""
    held = config.max_held_embedding_bytes if holds_images(runner) else 0
    if runner.device.type == "cuda":
        budget = measured_budget(
            CudaProbe(runner.device),
            config.gpu_memory_utilization,
            held,
            lambda: profile_step(runner, config),
            rank,
        )
    else:
        mc = runner.model_config
        weights = module_bytes(runner.model)
        peak = estimated_step_peak(
            mc.hidden_size, mc.widest_mlp, mc.vocab_size,
            config.max_num_batched_tokens, config.max_num_seqs, config.torch_dtype,
            embedding_width=mc.embedding_width, extra_width=mc.step_extra_width,
        )  # fmt: skip
        total = config.memory_budget_bytes
        source = "CPU: configured budget, estimated step peak"
        if total is None:
            total = weights + peak + held + DEFAULT_CPU_KV_BYTES
            source = "CPU: no budget configured, KV gets the default 512 MiB"
        budget = MemoryBudget(total, 1.0, weights, peak, held, rank=rank, source=source)
    budget.log()
    return budget


@torch.inference_mode()
def profile_step(runner, config: EngineConfig) -> ProfiledStep:
    """Run the largest step the engine may schedule on `runner`'s device, with a KV cache
    just big enough for it: `max_num_batched_tokens` prefill tokens (spread over up to
    `max_num_seqs` sequences) whose every row is an image row assembled into the input
    embeddings, then the sampler's widest path over `max_num_seqs` rows. Returns what ran
    and the bytes of its KV cache and of the embeddings its image rows are taken from,
    which the budget counts in other terms. Under tensor parallelism its collectives run
    on the start group (`runner.profiling_collectives`)."""
    with runner.profiling_collectives():
        return _run_largest_step(runner, config)


def _run_largest_step(runner, config: EngineConfig) -> ProfiledStep:
    mc, page, device = runner.model_config, runner.page_size, runner.device
    tokens, rows = config.max_num_batched_tokens, config.max_num_seqs
    count = min(rows, tokens)
    lengths = [tokens // count + (i < tokens % count) for i in range(count)]
    num_pages = sum(-(-length // page) for length in lengths)
    scratch, kv_bytes = runner.scratch_backend(num_pages)
    # A hybrid model's sequences step with state slots: a pool just for them, as the KV.
    states = None
    if mc.is_hybrid:
        states = StatePool(runner.linear_shape, mc.num_linear_layers, rows, 0, device)
    seqs, chunks, next_page = [], [], 0
    for i in range(rows):
        params = SamplingParams(**_WIDEST, top_k=50 if i % 2 else 0, max_tokens=1)
        length = lengths[i % count]
        seq = Sequence(f"memory-profile-{i}", [i % mc.vocab_size] * length, params)
        seq.state_slot = i if states is not None else None
        seqs.append(seq)
        if i < count:
            seq.block_table = list(range(next_page, next_page + -(-length // page)))
            # The scratch pools are addressed by the same pages (runner.scratch_backend).
            seq.window_table = seq.block_table
            next_page += len(seq.block_table)
            chunks.append(ScheduledChunk(seq, 0, length))
    saved = runner.__dict__.get("backend")
    saved_states = runner.__dict__.get("state_pool")
    runner.backend = scratch
    runner.state_pool = states
    try:
        inputs = runner.prepare(chunks)
        # Stand-ins for the held embeddings the image rows come from (their own term of
        # the budget), and each chunk's rows gathered from them into a copy, as a chunk
        # that spans two images gets (iris_kernels/chunk_rows.py); every deepstack level wide.
        held = [
            torch.zeros(
                chunk.num_tokens, mc.embedding_width, dtype=config.torch_dtype, device=device
            )
            for chunk in chunks
        ]
        images = [ChunkImageRows(torch.arange(rows.shape[0]), rows.clone()) for rows in held]
        embeds, deepstack = runner.assemble(inputs, images)
        logits = runner.execute(inputs, embeds, deepstack)
        # The sampler at the maximum batch: rows past the sequences computed repeat theirs.
        logits = logits[torch.arange(rows, device=logits.device) % count]
        sampled = Sampler(config.seed, device).sample(logits, seqs).resolve()
    finally:
        if saved is None:
            del runner.backend
        else:
            runner.backend = saved
        runner.state_pool = saved_states
    image_bytes = sum(rows.numel() * rows.element_size() for rows in held)
    del scratch, held, states
    return ProfiledStep(
        int(inputs.input_ids.shape[0]), int(embeds.shape[0]), len(sampled), kv_bytes, image_bytes
    )
