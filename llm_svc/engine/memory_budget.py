"""The memory budget of one rank and the KV pages it leaves (docs/design/engine.md,
"Memory budget").

    KV bytes = utilisation × total − weights − step peak − held embeddings − other

`step peak` is what one step adds on top of the weights at its largest: the configured
maximum batched tokens in one forward, with image rows for every one of them assembled
into the input embeddings, and the sampler's vocab-wide buffers at the maximum batch.
`held embeddings` is IRIS_LLM_MAX_HELD_EMBEDDING_BYTES (the fetcher makes admission wait
at it, so it is a bound, not a guess). `other` is memory outside torch's allocator (the
CUDA context, libraries' workspaces, other processes on the device).

Each byte is counted once: the profiling step needs a KV cache and the embeddings its
image rows come from, and both are taken out of its measured peak, since the KV term and
`held embeddings` already count them:

    step peak = allocator peak during the profile − weights − its KV cache − its image rows

On CUDA the step peak is measured (`measured_budget` around `profile_step`); on the CPU,
where torch keeps no allocator statistics, it is estimated (`estimated_step_peak`) and the
total is the configured budget. Every figure is one rank's: with tensor parallelism each
rank measures its own budget and the pod takes `pages_across_ranks`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import torch

log = logging.getLogger(__name__)

# The sampler's buffers per logit at its widest (fp32 logits, log-softmax for logprobs,
# penalty counts, sorted values, int64 sort order, probabilities, noise, bool masks): an
# over-count of what llm_svc/engine/sampling.py holds at once, for the CPU estimate.
SAMPLER_BYTES_PER_LOGIT = 40


@dataclass(frozen=True)
class ProfiledStep:
    """What the profiling step ran (tokens in one forward, image rows assembled, sampler
    rows) and what it allocated that another term of the budget counts: its KV cache
    (`kv_bytes`) and the embeddings its image rows stand for (`image_bytes`, the held
    embeddings a real step reads)."""

    tokens: int
    image_rows: int
    sampled_rows: int
    kv_bytes: int = 0
    image_bytes: int = 0

    @property
    def counted_elsewhere(self) -> int:
        return self.kv_bytes + self.image_bytes


@dataclass(frozen=True)
class MemoryBudget:
    """One rank's accounting, in bytes. `kv_bytes` is what is left for the KV cache."""

    total: int
    utilisation: float
    weights: int
    step_peak: int
    held_embeddings: int
    other: int = 0
    rank: int = 0
    source: str = ""  # how total and step_peak were had, for the log

    @property
    def usable(self) -> int:
        return int(self.total * self.utilisation)

    @property
    def kv_bytes(self) -> int:
        return self.usable - self.weights - self.step_peak - self.held_embeddings - self.other

    def num_pages(self, bytes_per_page: int) -> int:
        """KV pages this budget holds; ValueError naming every part if not one."""
        pages = self.kv_bytes // bytes_per_page
        if pages < 1:
            raise ValueError(
                f"rank {self.rank}: the memory budget leaves {self.kv_bytes} bytes for the KV "
                f"cache, less than one page ({bytes_per_page} bytes): {self.describe()}"
            )
        return pages

    def describe(self) -> str:
        mib = 1 << 20
        return (
            f"utilisation {self.utilisation:g} x total {self.total / mib:.0f} MiB "
            f"- weights {self.weights / mib:.0f} MiB - step peak {self.step_peak / mib:.0f} MiB "
            f"- held embeddings {self.held_embeddings / mib:.0f} MiB "
            f"- other {self.other / mib:.0f} MiB = KV {self.kv_bytes / mib:.0f} MiB"
        )

    def log(self) -> None:
        log.info("memory budget, rank %d (%s): %s", self.rank, self.source, self.describe())


def pages_across_ranks(budgets: list[MemoryBudget], bytes_per_page: int) -> int:
    """Every rank holds its shard of every page, so the pod has as many as the tightest
    rank (`bytes_per_page` is one rank's share of a page)."""
    return min(budget.num_pages(bytes_per_page) for budget in budgets)


class MemoryProbe(Protocol):
    """What the budget reads from a device: its total, what torch has allocated now and at
    most since `reset_peak`, and what is used outside torch's allocator."""

    def total_bytes(self) -> int: ...
    def allocated_bytes(self) -> int: ...
    def reset_peak(self) -> None: ...
    def peak_bytes(self) -> int: ...
    def other_bytes(self) -> int: ...


class CudaProbe:
    """A CUDA device's memory, from torch's caching allocator and the driver."""

    def __init__(self, device: torch.device) -> None:
        self.device = device

    def total_bytes(self) -> int:
        return torch.cuda.mem_get_info(self.device)[1]

    def allocated_bytes(self) -> int:
        return torch.cuda.memory_allocated(self.device)

    def reset_peak(self) -> None:
        torch.cuda.synchronize(self.device)
        torch.cuda.reset_peak_memory_stats(self.device)

    def peak_bytes(self) -> int:
        torch.cuda.synchronize(self.device)
        return torch.cuda.max_memory_allocated(self.device)

    def other_bytes(self) -> int:
        # Used on the device (by anyone) minus what torch's allocator holds: the CUDA
        # context, cuBLAS / Triton workspaces, other processes. Read after the profile, with
        # the allocator's cache emptied, so reserved-but-free blocks do not count twice.
        torch.cuda.empty_cache()
        free, total = torch.cuda.mem_get_info(self.device)
        return max(0, total - free - torch.cuda.memory_reserved(self.device))


def measured_budget(
    probe: MemoryProbe,
    utilisation: float,
    held_embeddings: int,
    profile: Callable[[], ProfiledStep],
    rank: int = 0,
) -> MemoryBudget:
    """The budget with the step peak measured: `profile()` runs the largest step while the
    probe records the allocator's peak; call with only the weights loaded. What the
    profile reports as counted elsewhere (its KV cache, its image rows) is not step peak."""
    weights = probe.allocated_bytes()
    probe.reset_peak()
    step = profile()
    peak = max(0, probe.peak_bytes() - weights - step.counted_elsewhere)
    return MemoryBudget(
        total=probe.total_bytes(),
        utilisation=utilisation,
        weights=weights,
        step_peak=peak,
        held_embeddings=held_embeddings,
        other=probe.other_bytes(),
        rank=rank,
        source="profiled step",
    )


def estimated_step_peak(
    hidden: int,
    intermediate: int,
    vocab: int,
    max_tokens: int,
    max_seqs: int,
    dtype: torch.dtype,
    embedding_width: int | None = None,
    extra_width: int = 0,
) -> int:
    """An upper estimate of one step's peak (for the CPU, which has no allocator peak): a
    layer's live activations for `max_tokens` (residual, normed input, q/k/v, attention
    output, the MLP's gate, up and product), the input embeddings with as many image rows
    gathered per chunk and concatenated (`embedding_width` wide: with deepstack levels; the
    held embeddings they come from are their own term), and the logits and sampler buffers
    for `max_seqs` rows. `extra_width`: more values live per token (Gemma 4's per-layer
    inputs and routed experts, `TextModelConfig.step_extra_width`)."""
    itemsize = torch.empty((), dtype=dtype).element_size()
    activations = max_tokens * (6 * hidden + 3 * intermediate + extra_width) * itemsize
    embeddings = max_tokens * (hidden + 2 * (embedding_width or hidden)) * itemsize
    sampler = max_seqs * vocab * SAMPLER_BYTES_PER_LOGIT
    return activations + embeddings + sampler


def module_bytes(module: torch.nn.Module) -> int:
    """Bytes of a module's parameters and buffers (its weights, on any device)."""
    tensors = [*module.parameters(), *module.buffers()]
    return sum(t.numel() * t.element_size() for t in tensors)
