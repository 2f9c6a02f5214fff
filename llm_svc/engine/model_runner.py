"""Runs the language model on one scheduled step: packs the chunks, sizes and owns the
paged KV cache (one pool per layer kind when some layers slide), returns the logits of the
sequences that sample this step."""

from __future__ import annotations

import logging
from contextlib import nullcontext
from dataclasses import dataclass

import numpy as np
import torch

from llm_svc.engine.attention import AttentionMetadata, KVCache, make_backend
from llm_svc.engine.attention.kinds import KindsBackend
from llm_svc.engine.config import EngineConfig
from llm_svc.engine.embeddings.assembly import assemble_input_embeds, deepstack_rows
from llm_svc.engine.host_tier import HostTier
from llm_svc.engine.kv_sizing import KindPages, kv_budget
from llm_svc.engine.models import load_model
from llm_svc.engine.models.config import FULL, LINEAR, SLIDING
from llm_svc.engine.models.decoder import SampledRows
from llm_svc.engine.models.gated_deltanet import choose_kernels
from llm_svc.engine.models.qwen3_5 import StepStates
from llm_svc.engine.pending import PendingTokens
from llm_svc.engine.scheduler import ScheduledChunk
from llm_svc.engine.state_pool import HybridSizing, StatePool, split_budget
from llm_svc.engine.transfer import to_device
from llm_svc.engine.window_pages import WindowNeed

log = logging.getLogger(__name__)


@dataclass
class StepInputs:
    """One packed step: chunk after chunk. `sample_rows` are the flat indices of each
    sampling chunk's (`sample_chunks[i]`) last token, preceded by one row per draft token
    when the chunk carries drafts (speculative decoding: its last 1 + drafts tokens)."""

    input_ids: torch.Tensor  # [T] int64 (may hold multimodal sentinels: clamp before embed)
    positions: torch.Tensor  # [T], or [3, T] with M-RoPE
    meta: AttentionMetadata
    sample_rows: torch.Tensor
    sample_chunks: list[ScheduledChunk]
    state_slots: list[int] | None = None  # hybrid models: each chunk's state slot
    sample_entries: list[int] | None = None  # the chunk (meta entry) of each sample row
    num_drafts: int = 0  # draft rows among the sample rows


class ModelRunner:
    """One device's model and KV cache. With `group` (tensor parallelism) it holds that
    rank's shard: its heads' share of every KV page (llm_svc/engine/parallel).

    A model with sliding-window layers (not hybrid) gets two pools of pages, same page
    size: `kv_cache` (`num_pages`) for the full-attention layers and `window_cache`
    (`num_window_pages`, page 0 the null page) for the sliding ones (docs/design/engine.md,
    "Pages per layer kind"); `window` is then their window, else None. Each pool's pages
    have its kind's K/V shape, and only the layers that keep KV have a layer in it: one
    that reuses another's KV (Gemma 4) reads its source's."""

    def __init__(self, config: EngineConfig, group=None) -> None:
        self.config = config
        self.device = torch.device(config.device)
        self.model, self.model_config = load_model(
            config.model_dir, config.torch_dtype, self.device, group
        )
        self.page_size = config.page_size
        # Gemma 4 returns only the sampled rows' hidden states (DecoderLM.keeps_sampled_rows).
        self.keeps_sampled_rows = getattr(self.model, "keeps_sampled_rows", False)
        # Speculative decoding with MTP: `execute` keeps the step's last hidden states [T, H]
        # (the final norm's output, every row) in `last_hidden` for the drafter.
        self.keep_hidden = False
        self.last_hidden: torch.Tensor | None = None
        mc = self.model_config
        self.num_kv_heads = mc.num_kv_heads if group is None else group.num_local_kv_heads(mc)
        self.rank = 0 if group is None else group.rank
        self.group = group
        # Rank 0 under tensor parallelism: the state pool's and host tier's operations, in
        # order, for the other ranks to replay (llm_svc/engine/parallel/channel.py).
        self.journal: list[tuple[int, int, int]] | None = [] if group and self.rank == 0 else None
        self.state_pool: StatePool | None = None
        self.host_tier: HostTier | None = None
        # The layers that keep KV, by kind; `readers`: those that read another's instead.
        self.sliding_layers = mc.kv_layers(SLIDING)
        self.full_layers = [
            i for i in range(mc.num_layers) if mc.layer_type(i) != SLIDING and mc.kv_source(i) == i
        ]
        self.readers = {i: mc.kv_source(i) for i in range(mc.num_layers) if mc.kv_source(i) != i}
        self.window: int | None = None
        self.num_window_pages = 0
        self.window_cache: KVCache | None = None
        if self.sliding_layers and not mc.is_hybrid:
            self.window = mc.sliding_window
            self.num_pages, self.num_window_pages = self._kind_sizing(config)
            self._allocate_kinds(config)
            self._attach_host_tier(config)
            return
        if mc.is_hybrid:
            # This rank's heads' states; rank 0 journals its pool's resets and copies for
            # the others (llm_svc/engine/parallel/channel.py).
            self.linear_shape = mc.linear if group is None else mc.linear.per_rank(group.size)
            self.rule_kernels = choose_kernels(config.linear_attention_kernels, self.device)
            sizing = self._hybrid_sizing(config)
            self.num_pages = sizing.num_pages
            self.state_pool = StatePool(
                self.linear_shape, mc.num_linear_layers, sizing.running_slots,
                sizing.snapshot_slots, self.device, journal=self.journal,
            )  # fmt: skip
            log.info(
                "linear-attention states: %d running + %d snapshot slots of %d bytes (fp32)",
                sizing.running_slots, sizing.snapshot_slots, self._slot_bytes(),
            )  # fmt: skip
        else:
            self.num_pages = self._num_pages(config)
        self.kv_cache = KVCache.allocate(
            mc.num_kv_layers, self.num_pages, self.page_size, self.num_kv_heads, mc.head_dim,
            config.torch_dtype, self.device,
        )  # fmt: skip
        self.backend = make_backend(config.attention_backend, self.kv_cache)
        log.info("KV cache: %d pages of %d tokens", self.num_pages, self.page_size)
        self._attach_host_tier(config)

    def _attach_host_tier(self, config: EngineConfig) -> None:
        """The host tier for the pools just made (`host_kv_bytes`, the pod's; 0: none).
        Under tensor parallelism the ranks share the budget: each holds its heads' share of
        every unit, with the same slots (its pools are the same share of the pod's)."""
        if not config.host_kv_bytes or not config.enable_prefix_caching:
            return
        self.host_tier = HostTier(
            config.host_kv_bytes // config.tensor_parallel_size, self.kv_cache,
            self.window_cache, self.state_pool, self.device, self.journal,
        )  # fmt: skip
        slots = self.host_tier.capacity
        log.info(
            "host KV tier: %d bytes, %d pages, %d window pages, %d state snapshots",
            self.host_tier.sizing.total_bytes, slots["page"], slots["window"], slots["state"],
        )  # fmt: skip

    def _allocate_kinds(self, config: EngineConfig) -> None:
        self.kv_cache, self.window_cache, self.backend = self._kind_pools(
            config, self.num_pages, self.num_window_pages
        )
        log.info(
            "KV cache: %d pages for %d full-attention layers, %d for %d sliding layers "
            "(window %d) of %d tokens",
            self.num_pages, len(self.full_layers), self.num_window_pages,
            len(self.sliding_layers), self.window, self.page_size,
        )  # fmt: skip

    def _kind_pools(
        self, config: EngineConfig, num_pages: int, num_window_pages: int
    ) -> tuple[KVCache, KVCache, KindsBackend]:
        """(full pool, sliding pool, their backend): each pool `_pool_shape` of its kind."""
        dtype = config.torch_dtype
        full_cache = KVCache.allocate(
            len(self.full_layers), num_pages, self.page_size, *self._pool_shape(FULL), dtype,
            self.device,
        )  # fmt: skip
        window_cache = KVCache.allocate(
            len(self.sliding_layers), num_window_pages, self.page_size,
            *self._pool_shape(SLIDING), dtype, self.device,
        )  # fmt: skip
        name = config.attention_backend
        full = make_backend(name, full_cache) if self.full_layers else None
        sliding = make_backend(name, window_cache)
        backend = KindsBackend(
            full, sliding, self.full_layers, self.sliding_layers, self.readers or None
        )
        return full_cache, window_cache, backend

    def _pool_shape(self, kind: str) -> tuple[int, int]:
        """(KV heads on this rank, head_dim) of `kind`'s pages."""
        mc = self.model_config
        if mc.kv_shapes is None:
            return self.num_kv_heads, mc.head_dim
        # Kinds of their own shapes (Gemma 4): under tensor parallelism this rank's share of
        # the kind's KV heads, or the one it replicates (parallel/sharding.py).
        shape = mc.kv_shape(kind)
        if self.group is None:
            return shape.num_kv_heads, shape.head_dim
        start, stop = self.group.kv_heads(shape.num_kv_heads)
        return stop - start, shape.head_dim

    def scratch_backend(self, num_pages: int):
        """(backend, KV bytes) over fresh pools of `num_pages` pages each, every layer with
        KV addressed by the same pages: the memory profile's step."""
        config, mc = self.config, self.model_config
        if not self.sliding_layers or mc.is_hybrid:
            kv = KVCache.allocate(  # this rank's heads (tensor parallelism holds a share)
                mc.num_kv_layers, num_pages, self.page_size, self.num_kv_heads, mc.head_dim,
                config.torch_dtype, self.device,
            )  # fmt: skip
            pools = [kv]
            backend = make_backend(config.attention_backend, kv)
        else:
            full, window, backend = self._kind_pools(config, num_pages, num_pages)
            pools = [full, window]
        kv_bytes = sum(t.numel() * t.element_size() for pool in pools for t in (pool.k, pool.v))
        return backend, kv_bytes

    def _kind_sizing(self, config: EngineConfig) -> tuple[int, int]:
        """(full pages, window pages). `num_pages` fixes the full pool and the window
        pool gets as many (+ its null page). Else the byte budget must hold one sequence
        of `max_model_len` alone in both pools (rule (a), `_fit_max_model_len`), and what
        is left is split as more such sequences need it (`KindPages.split`)."""
        if config.num_pages is not None:
            return config.num_pages, config.num_pages + 1
        pages = KindPages(
            self.kv_bytes_per_page(self.full_layers),
            self.kv_bytes_per_page(self.sliding_layers),
            WindowNeed(self.window, self.page_size, config.max_num_batched_tokens),
        )
        budget = self._budget_bytes(config)
        self._fit_max_model_len(config, pages, budget)
        return pages.split(budget, config.max_model_len)

    def _fit_max_model_len(self, config: EngineConfig, pages: KindPages, budget: int) -> None:
        """Rule (a): a `max_model_len` whose sequence does not fit `budget` alone is
        refused if it was set, naming the longest that fits; unset (the model's
        max_position_embeddings) it becomes that, with a warning. Every rank agrees."""
        length = config.max_model_len
        longest = self._least_over_ranks(pages.longest(budget, length))
        if longest == length:
            return
        need = pages.bytes_alone(length)
        why = (
            f"KV budget {budget} bytes cannot hold one sequence of max_model_len {length}: "
            f"it needs {need} bytes, {pages.pages_for(length)} full-attention pages of "
            f"{pages.full_bytes} bytes and {pages.need.pages(length)} sliding-window pages "
            f"of {pages.window_bytes} bytes (a decode's window, one step's chunk of "
            f"{config.max_num_batched_tokens} tokens, the null page)"
        )
        if longest < 2:
            raise ValueError(f"{why}; not even 2 tokens fit: raise the KV budget")
        if config.max_model_len_given:
            raise ValueError(
                f"{why}; the largest max_model_len that fits is {longest}: set it at most "
                f"that, or raise the KV budget"
            )
        log.warning("%s; serving with max_model_len %d, the largest that fits", why, longest)
        config.max_model_len = longest

    def _least_over_ranks(self, value: int) -> int:
        """`value` as every rank can meet it: itself on one device (a tensor-parallel
        rank takes the minimum over the ranks)."""
        return value

    def kv_bytes_per_page(self, layers: list[int] | None = None) -> int:
        """Bytes of one page for `layers` (default: every layer with KV), each layer at its
        kind's K/V shape; a layer reusing another's KV holds none."""
        mc = self.model_config
        if layers is None:
            layers = [i for i in range(mc.num_layers) if mc.layer_type(i) != LINEAR]
        return sum(
            KVCache.bytes_per_page(
                1, self.page_size, *self._pool_shape(mc.layer_type(i)), self.config.torch_dtype
            )
            for i in layers
            if mc.kv_source(i) == i
        )

    def _slot_bytes(self) -> int:
        mc = self.model_config
        return StatePool.bytes_per_slot(self.linear_shape, mc.num_linear_layers)

    def _budget_bytes(self, config: EngineConfig) -> int:
        if config.kv_cache_bytes is not None:
            return config.kv_cache_bytes
        # the memory budget: docs/design/engine.md, llm_svc/engine/kv_sizing.py
        return kv_budget(self, config, self.rank).kv_bytes

    def _hybrid_sizing(self, config: EngineConfig) -> HybridSizing:
        """KV pages and state slots: running slots for `max_num_seqs` (twice as many with
        speculative decoding: a drafting sequence keeps its state from before the step in
        a second one), and with the prefix cache one snapshot slot per
        `state_snapshot_interval` pages, all in the budget."""
        interval = config.state_snapshot_interval if config.enable_prefix_caching else None
        running = config.max_num_seqs * (2 if config.num_speculative_tokens else 1)
        if config.num_pages is not None:
            snapshots = 0 if interval is None else max(1, config.num_pages // interval)
            return HybridSizing(config.num_pages, running, snapshots)
        return split_budget(
            self._budget_bytes(config), self.kv_bytes_per_page(), self._slot_bytes(),
            running, interval,
        )  # fmt: skip

    def _num_pages(self, config: EngineConfig) -> int:
        if config.num_pages is not None:
            return config.num_pages
        per_page = self.kv_bytes_per_page()
        budget = config.kv_cache_bytes
        if budget is None:  # the memory budget: docs/design/engine.md, engine/kv_sizing.py
            return kv_budget(self, config, self.rank).num_pages(per_page)
        pages = budget // per_page
        if pages < 1:
            raise ValueError(f"KV budget {budget} bytes is less than one page ({per_page} bytes)")
        return int(pages)

    def close(self) -> None:
        """Nothing to stop on one device (the tensor-parallel runner stops its ranks)."""

    def profiling_collectives(self):
        """A context for the memory budget's profiling step: nothing on one device (the
        tensor-parallel runner moves the step's collectives to the start group)."""
        return nullcontext()

    def prepare(
        self, chunks: list[ScheduledChunk], pending: PendingTokens | None = None
    ) -> StepInputs:
        """Pack the step's chunks into flat tensors and attention metadata. A chunk that
        reaches its sequence's last token while that token is still `pending` on the device
        takes it from there: the ids are completed by device indexing, with no host sync."""
        ids, positions, slots = [], [], []
        pending_flat, pending_seqs = [], []
        starts, lens, contexts, tables, sample_rows, sample_chunks = [], [], [], [], [], []
        sample_entries = []
        mrope = any(chunk.seq.mrope_positions is not None for chunk in chunks)
        # A step whose prefill chunks hold image spans that attend both ways.
        spans = any(chunk.seq.uncut_spans and chunk.num_tokens > 1 for chunk in chunks)
        until = []
        window_slots, window_tables = [], []
        flat, size = 0, self.page_size
        for chunk in chunks:
            seq, begin, end = chunk.seq, chunk.start, chunk.start + chunk.num_tokens
            ids.extend(seq.token_ids[begin:end])
            pos = seq.positions(begin, end)
            if mrope and pos.ndim == 1:
                pos = np.broadcast_to(pos, (3, len(pos)))
            positions.append(pos)
            if spans:
                until.append(seq.attend_until(begin, end))
            table = np.asarray(seq.block_table, dtype=np.int64)
            index = np.arange(begin, end)
            slots.append(table[index // size] * size + index % size)
            if self.window_cache is not None:
                window = np.asarray(seq.window_table, dtype=np.int64)
                window_slots.append(window[index // size] * size + index % size)
                window_tables.append(seq.window_table)
            starts.append(flat)
            lens.append(chunk.num_tokens)
            contexts.append(end)
            tables.append(seq.block_table)
            flat += chunk.num_tokens
            if seq.num_pending and chunk.samples:
                pending_flat.append(flat - 1)
                pending_seqs.append(seq)
            if chunk.samples:
                sample_rows.extend(range(flat - 1 - chunk.num_drafts, flat))
                sample_chunks.append(chunk)
                sample_entries.extend([len(starts) - 1] * (1 + chunk.num_drafts))
        device = self.device
        meta = AttentionMetadata(
            slot_mapping=to_device(np.concatenate(slots), device),
            query_starts=starts,
            query_lens=lens,
            context_lens=contexts,
            block_tables=to_device(_padded(tables), device),
            attend_until=to_device(np.concatenate(until), device) if spans else None,
        )
        if window_tables:
            meta.window_slot_mapping = to_device(np.concatenate(window_slots), device)
            meta.window_block_tables = to_device(_padded(window_tables), device)
        input_ids = to_device(np.asarray(ids, dtype=np.int64), device)
        if pending_seqs:
            assert pending is not None, "a placeholder without the step that samples it"
            index = to_device(np.asarray(pending_flat, dtype=np.int64), device)
            input_ids.index_copy_(0, index, pending.gather(pending_seqs))
        return StepInputs(
            input_ids=input_ids,
            positions=to_device(np.concatenate(positions, axis=-1), device),
            meta=meta,
            sample_rows=to_device(np.asarray(sample_rows, dtype=np.int64), device),
            sample_chunks=sample_chunks,
            state_slots=[c.seq.state_slot for c in chunks] if self.state_pool else None,
            sample_entries=sample_entries,
            num_drafts=sum(chunk.num_drafts for chunk in sample_chunks),
        )

    def run(self, inputs: StepInputs, image_rows: list) -> torch.Tensor:
        """Assemble the step's input embeddings (image rows scattered in, deepstack levels
        set aside for their layers) and execute."""
        embeds, deepstack = self.assemble(inputs, image_rows)
        return self.execute(inputs, embeds, deepstack)

    def assemble(self, inputs: StepInputs, image_rows: list, starts: list[int] | None = None):
        """(input embeddings or None, deepstack rows or None) of a step's image rows;
        `starts[i]` is where image_rows[i]'s chunk starts (default: the chunks' starts)."""
        mc = self.model_config
        starts = inputs.meta.query_starts if starts is None else starts
        embeds = assemble_input_embeds(
            self.model.embed, inputs.input_ids, image_rows, starts, mc.vocab_size, mc.hidden_size
        )
        return embeds, deepstack_rows(image_rows, starts, mc.hidden_size, mc.deepstack_levels)

    def forward_hidden(self, inputs: StepInputs, input_embeds, deepstack) -> torch.Tensor:
        """The model's last hidden states [T, H]; for a model that `keeps_sampled_rows`,
        only the sample rows' [N, H] (`sampled_hidden` takes them either way)."""
        self.backend.plan(inputs.meta)
        extra = {}
        if self._takes_sampled(inputs):
            last = inputs.meta.last_tokens(inputs.sample_entries, inputs.sample_rows)
            extra["sampled"] = SampledRows(inputs.sample_rows, last)
        if deepstack is not None:
            extra["deepstack"] = deepstack
        if self.state_pool is not None:
            meta = inputs.meta
            assert None not in inputs.state_slots, "a hybrid step's sequence has no state slot"
            extra["states"] = StepStates(
                self.state_pool, meta.query_starts, meta.query_lens, inputs.state_slots,
                self.rule_kernels,
            )  # fmt: skip
        return self.model(inputs.input_ids, inputs.positions, self.backend, input_embeds, **extra)

    @torch.inference_mode()
    def execute(self, inputs: StepInputs, input_embeds: torch.Tensor | None = None,
                deepstack=None):  # fmt: skip
        """Run the model; returns fp32 logits [len(sample_chunks), vocab]."""
        hidden = self.forward_hidden(inputs, input_embeds, deepstack)
        if self.keep_hidden:  # every row's: MTP drafting reads them (spec/mtp_proposer.py)
            self.last_hidden = hidden
        return self.model.compute_logits(self.sampled_hidden(inputs, hidden))

    def sampled_hidden(self, inputs: StepInputs, hidden: torch.Tensor) -> torch.Tensor:
        """The sample rows of `forward_hidden`'s output."""
        if self._takes_sampled(inputs) or (self.keeps_sampled_rows and _every_row_samples(inputs)):
            return hidden
        return hidden[inputs.sample_rows]

    def _takes_sampled(self, inputs: StepInputs) -> bool:
        """The model computes only the sample rows (`SampledRows`): not for a step with
        drafts, whose rows of one sequence attend to each other."""
        return self.keeps_sampled_rows and not inputs.num_drafts and not _every_row_samples(inputs)


def _every_row_samples(inputs: StepInputs) -> bool:
    """A step of one-token chunks that all sample (plain decode): its hidden rows are the
    sample rows already, in order."""
    lens = inputs.meta.query_lens
    return len(inputs.sample_entries) == len(lens) and max(lens) == 1


def _padded(tables: list[list[int]]) -> np.ndarray:
    """Block tables as one int64 array, each padded with page 0 to the widest."""
    width = max(len(table) for table in tables)
    return np.asarray([table + [0] * (width - len(table)) for table in tables], dtype=np.int64)
