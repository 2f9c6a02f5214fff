"""LLMEngine: requests in, token and text deltas out, one scheduled step at a time."""

from __future__ import annotations

import contextvars
import functools
import logging
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import blake3
import numpy as np
import torch

from iris.models.checkpoint import read_config
from iris.models.reasoning import think_markers
from iris.multimodal import (
    PrefixResumeRule,
    check_vocab_size,
    processor_fingerprint,
)
from iris.rates import Rate
from llm_svc.engine.block_manager import BlockManager
from llm_svc.engine.config import EngineConfig
from llm_svc.engine.detokenizer import IncrementalDetokenizer
from llm_svc.engine.embeddings import (
    CacheEmbeddingSource,
    EmbeddingFetcher,
    EmbeddingSource,
    chunk_image_rows,
)
from llm_svc.engine.errors import InvalidRequestError, RequestDataError
from llm_svc.engine.grammar import (
    CompilingRequests,
    GrammarCompilerPool,
    GrammarLimits,
    RequestGrammar,
    StepConstraints,
)
from llm_svc.engine.grammar.request import GrammarViolation
from llm_svc.engine.host_tier import PAGE
from llm_svc.engine.kv_events import KVEvent, StoreStored
from llm_svc.engine.kv_store import KVStoreClient
from llm_svc.engine.models.config import UnsupportedModelError
from llm_svc.engine.outputs import (
    EngineRates,
    EngineStats,
    RequestOutput,
    StoreSnapshot,
    TierSnapshot,
)
from llm_svc.engine.parallel import make_runner
from llm_svc.engine.pending import PendingTokens
from llm_svc.engine.radix_cache import RadixCache
from llm_svc.engine.sampling import SampledToken, Sampler, StepSample
from llm_svc.engine.sampling_params import SamplingParams
from llm_svc.engine.scheduler import Scheduler
from llm_svc.engine.sequence import FinishReason, Sequence, SequenceStatus
from llm_svc.engine.spec import Speculator, Verification, make_speculator
from llm_svc.engine.spec.verify import Verdict, verify
from llm_svc.engine.store_link import StoreLink
from llm_svc.engine.transfer import to_device
from llm_svc.engine.validation import check_cache_salt, check_request
from llm_svc.engine.window_pages import WindowNeed, WindowPages

log = logging.getLogger(__name__)


# A fetch can be waited on this long when nothing else can run, so an idle loop does not spin.
IDLE_WAIT_S = 0.005
# The probe request (`LLMEngine.probe`): its id, and the steps it may take (overlap retires a
# step one step late, so two do).
PROBE_ID = "iris-probe"
PROBE_MAX_STEPS = 8


@dataclass
class LaunchedStep:
    """A step on its way through the device: its chunks, its sampling sequences (`slots[i]`
    is the index of seqs[i]'s placeholder), its draws, and those as `pending` for the next
    step's inputs."""

    chunks: list
    seqs: list[Sequence]
    slots: list[int]
    sample: StepSample
    pending: PendingTokens
    # Speculative decoding: the verification of the sequences that carried drafts.
    verification: Verification | None = None
    draft_seqs: list[Sequence] | None = None

    @property
    def constrained(self) -> bool:
        return any(seq.grammar is not None for seq in self.seqs)


def load_tokenizer(path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(path))


def load_vlm_adapter(model_dir, architecture: str, revision: str = ""):
    """The model adapter of a vision-language checkpoint, or None for a plain LM (no
    adapter serves its architecture)."""
    from iris.models import has_adapter, load_adapter

    if not has_adapter(architecture):
        return None
    return load_adapter(model_dir, revision=revision)


def check_chunk_budget(adapter, max_num_batched_tokens: int) -> None:
    """UnsupportedModelError unless one step's token budget holds the longest span a prefill
    chunk must take whole (a model whose image tokens attend both ways: Gemma 3)."""
    if adapter is None or not adapter.bidirectional_image_spans:
        return
    span = adapter.max_uncut_span
    if max_num_batched_tokens < span:
        raise UnsupportedModelError(
            f"max_num_batched_tokens={max_num_batched_tokens} is smaller than one image span "
            f"({span} tokens) of {adapter.architecture}, whose image tokens attend to each "
            f"other both ways and must be prefilled in one chunk: set at least {span}"
        )


def positions_salt(salt: bytes, positions: np.ndarray) -> bytes:
    """The prefix-cache namespace of a request run at caller-given positions: `salt`'s,
    narrowed to exactly these positions (32 bytes, like a tenant salt)."""
    table = np.ascontiguousarray(positions, dtype=np.int64)
    return blake3.blake3(b"iris-positions-v1" + bytes(salt) + table.tobytes()).digest()


def _rows(values: torch.Tensor, rows: list[int]) -> torch.Tensor:
    """`values[rows]`, the index sent to the values' device without a sync."""
    return values.index_select(0, to_device(np.asarray(rows, dtype=np.int64), values.device))


class LLMEngine:
    """`add_request` (validated: a bad request raises InvalidRequestError and nothing else
    is affected) → `step()` until `has_unfinished()` is False → `abort` at any time.
    `take_kv_events()` drains the prefix cache's stored / removed events.

    Requests may carry images (`items`) when the model is a VLM and embeddings have a
    source: `embedding_source`, else the cache service at `config.cache_address`. A request
    whose embeddings cannot be had ends with finish_reason "error" and
    `RequestOutput.error` (ImageFailedError, EmbeddingMissingError, CacheUnavailableError)
    before it is accepted (`Sequence.accepted`: first scheduled, every embedding held).

    One request's bad data found late (RequestDataError: an embedding that is not finite,
    or has too few rows or the wrong width at assembly) ends that request alone, with
    finish_reason "error", before or after acceptance: each chunk is checked and assembled
    on its own before the batched forward, so the others run exactly as they would have
    without it. Only what no request is to blame for (the device, memory) raises from
    `step`."""

    def __init__(
        self,
        config: EngineConfig,
        tokenizer: Any = None,
        embedding_source: EmbeddingSource | None = None,
    ) -> None:
        self.config = config
        self.prefill_rate = Rate()  # tokens per second of the steps that prefill
        architecture = (read_config(config.model_dir).get("architectures") or [""])[0]
        self.adapter = load_vlm_adapter(config.model_dir, architecture, config.model_revision)
        check_chunk_budget(self.adapter, config.max_num_batched_tokens)
        self.runner = make_runner(config)
        self.model_config = self.runner.model_config
        check_vocab_size(self.model_config.vocab_size)
        self.tokenizer = tokenizer or load_tokenizer(config.tokenizer_dir)
        self.fingerprint = processor_fingerprint(config.model_dir, config.model_revision)
        cache = None
        if config.enable_prefix_caching:
            cache = RadixCache(config.page_size, self.fingerprint, host=self.runner.host_tier)
        # The model's real layer kinds (windows; a hybrid model's linear layers with their
        # snapshot interval): GetModelInfo reports them, and the gateway builds this same
        # rule from them.
        self.resume_rule = PrefixResumeRule(
            config.page_size, self.model_config.resume_layers(config.state_snapshot_interval)
        )
        windows = self.window_need = None
        runner = self.runner
        if getattr(runner, "window", None) is not None:
            windows = WindowPages(runner.num_window_pages, config.page_size, runner.window, cache)
            self.window_need = WindowNeed(
                runner.window, config.page_size, config.max_num_batched_tokens
            )
        self.blocks = BlockManager(
            runner.num_pages, config.page_size, cache, self.resume_rule,
            getattr(runner, "state_pool", None), windows,
            full_layers=windows is None or bool(runner.full_layers),
        )  # fmt: skip
        self.kv_store = self._connect_store(cache)
        self.image_token_id = self.adapter.image_token_id if self.adapter else None
        # A video frame group's placeholder (Qwen families' <|video_pad|>) is never text.
        video = self.adapter.config.get("video_token_id") if self.adapter else None
        self.video_token_id = int(video) if video is not None else None
        self.fetcher = self._make_fetcher(embedding_source)
        self.scheduler = Scheduler(config, self.blocks, self.fetcher)
        self.sampler = Sampler(config.seed, self.runner.device)
        # None unless num_speculative_tokens > 0 (llm_svc/engine/spec).
        self.speculator: Speculator | None = make_speculator(
            config, self.model_config.vocab_size, self.runner
        )
        # A reasoning model's thought markers, from its own tokenizer (None: it does not think).
        self.think_markers = think_markers(self.tokenizer)
        self.eos_token_ids = set(self.model_config.eos_token_ids)
        if self.tokenizer.eos_token_id is not None:
            self.eos_token_ids.add(self.tokenizer.eos_token_id)
        self.grammars = self._make_grammars()
        self.compiling = CompilingRequests()
        self.constraints = StepConstraints(
            self.model_config.vocab_size, self.runner.device, frozenset(self.eos_token_ids)
        )
        self.requests: dict[str, Sequence] = {}
        self._pending: list[RequestOutput] = []
        self.overlap = config.overlap_scheduling
        self._inflight: LaunchedStep | None = None  # launched, not retired (overlap only)
        # The sequences of the step under way (scheduled, or launched and not yet retired):
        # those a failed step concerns (`recover`).
        self._stepping: list[Sequence] = []
        # A test-only hook run as each step launches (llm_svc/server/step_failures.py): None
        # unless the server was started with the test flag.
        self.step_fault: Callable[[], None] | None = None
        self._prompt_tokens = self._hit_tokens = self._generated_tokens = 0

    def _make_fetcher(self, source: EmbeddingSource | None) -> EmbeddingFetcher | None:
        config = self.config
        if self.adapter is None:
            return None
        if source is None and config.cache_address:
            source = CacheEmbeddingSource.connect(
                config.cache_address,
                self.fingerprint,
                wait_s=config.embedding_wait_s,
                timeout_s=config.cache_timeout_s,
                tls=config.cache_tls,
            )
        if source is None:
            return None
        return EmbeddingFetcher(
            source,
            # Every deepstack level is fetched, held and counted with its main row.
            self.model_config.embedding_width,
            config.torch_dtype,
            self.runner.device,
            config.embedding_fetch_workers,
            config.max_held_embedding_bytes,
        )

    def _make_grammars(self) -> GrammarCompilerPool:
        config = self.config
        limits = GrammarLimits(
            config.grammar_max_bytes,
            config.grammar_max_depth,
            config.grammar_compile_timeout_s,
            config.grammar_queue_timeout_s,
            config.grammar_failure_ttl_s,
        )
        return GrammarCompilerPool(
            self.tokenizer,
            self.model_config.vocab_size,
            self.eos_token_ids,
            limits,
            threads=config.grammar_compile_threads,
            cache_entries=config.grammar_cache_entries,
            worker_module=config.grammar_worker_module,
        )

    def _connect_store(self, cache: RadixCache | None) -> KVStoreClient | None:
        """The shared KV store's client when configured (the config made sure the host
        tier is on), linked to the block manager; the tier's generations follow the
        device units either way."""
        host = self.runner.host_tier
        if cache is not None and host is not None:
            cache.left = host.left
        if self.config.kv_store is None:
            return None
        client = KVStoreClient(self.config.kv_store)
        self.blocks.store = StoreLink(client, host, self.fingerprint)
        return client

    def close(self) -> None:
        """Stop the embedding fetcher (and its source's connections), the compilers,
        the KV store's writer and the other tensor-parallel ranks."""
        if self.kv_store is not None:
            self.kv_store.close()
        self.runner.close()
        if self.fetcher is not None:
            self.fetcher.close()
        self.grammars.close()

    # --- requests ----------------------------------------------------------------------
    def add_request(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        params: SamplingParams,
        *,
        items: list[Any] | None = None,
        mrope_positions: np.ndarray | None = None,
        context: contextvars.Context | None = None,
        cache_salt: bytes = b"",
    ) -> Sequence:
        """Queue one request; raises InvalidRequestError (naming value and limit) if bad.

        `context` is the caller's contextvars context for this request: work done for it on
        other threads (embedding fetches) runs inside it, so tracing spans there join the
        request's trace.

        `items` (iris.multimodal.MultimodalItem: key, offsets, token_count, grid) describe
        the images whose sentinels fill their spans of `prompt_token_ids`; M-RoPE positions
        are derived from their grids when the model needs them and none are given.

        `cache_salt` (empty, or 32 bytes) picks the prefix cache's namespace: requests with
        different salts share no cached page (docs/design/security.md)."""
        if request_id in self.requests:
            raise InvalidRequestError("request_id", request_id, "already in use")
        items = list(items or [])
        ids = check_request(
            prompt_token_ids,
            params,
            vocab_size=self.model_config.vocab_size,
            max_model_len=self.config.max_model_len,
            page_size=self.config.page_size,
            num_pages=self.runner.num_pages,
            items=items,
            accepts_images=self.fetcher is not None,
            image_token_id=self.image_token_id,
            video_token_id=self.video_token_id,
            window_need=self.window_need,
            num_window_pages=getattr(self.runner, "num_window_pages", 0),
        )
        check_cache_salt(cache_salt)
        if items and self.fetcher is not None:
            held, limit = self.fetcher.bytes_for(items), self.config.max_held_embedding_bytes
            if held > limit:  # it could never be admitted: the pod holds at most `limit`
                raise InvalidRequestError(
                    "items embedding bytes", held,
                    f"must be at most {limit} (IRIS_LLM_MAX_HELD_EMBEDDING_BYTES)",
                )  # fmt: skip
        if params.constraint is not None:
            self.grammars.check(params.constraint)
        if params.reasoning and self.think_markers is None:
            raise InvalidRequestError(
                "reasoning", True, "needs a model whose tokenizer and template have think markers"
            )
        if mrope_positions is not None and np.shape(mrope_positions) != (3, len(ids)):
            # Checked here, not found by the step that would use it.
            shape = np.shape(mrope_positions)
            raise InvalidRequestError("mrope_positions shape", shape, f"must be (3, {len(ids)})")
        if mrope_positions is not None:
            # The radix cache is keyed by token ids; KV computed at caller-chosen positions
            # differs from the same tokens' KV at derived ones, so such a request gets a
            # namespace of its own positions and shares pages only with identical ones.
            cache_salt = positions_salt(cache_salt, mrope_positions)
        elif items and self.model_config.mrope_section:
            mrope_positions = self._mrope_positions(len(ids), items)
        seq = Sequence(
            request_id,
            ids,
            params,
            items=items,
            mrope_positions=mrope_positions,
            cache_salt=bytes(cache_salt),
        )
        if self.adapter is not None and self.adapter.bidirectional_image_spans:
            seq.uncut_spans = [(start, end + 1) for item in items for start, end in item.offsets]
        seq.context = context
        seq.detokenizer = IncrementalDetokenizer(self.tokenizer, ids, params.skip_special_tokens)
        self.requests[request_id] = seq
        if params.constraint is not None:
            # Queued once its grammar is compiled (off this thread; see CompilingRequests).
            limit = self.config.grammar_queue_timeout_s
            future = self.grammars.submit(params.constraint, limit)
            thought_end = self.think_markers.end_id if params.reasoning else None
            seq.grammar = RequestGrammar(
                params.constraint,
                future,
                limit,
                lambda: self.grammars.ready_since,
                opens_after=thought_end,
                release=functools.partial(self.grammars.release, params.constraint),
            )
            self.compiling.add(seq)
        else:
            self.scheduler.add(seq)
        self._prompt_tokens += len(ids)
        return seq

    def _mrope_positions(self, length: int, items: list) -> np.ndarray:
        try:
            positions, _ = self.adapter.mrope_positions(length, items)
        except (ValueError, TypeError) as err:
            grids = [tuple(item.grid) for item in items]
            raise InvalidRequestError("items grid", grids, str(err)) from None
        return positions

    def abort(self, request_id: str) -> bool:
        """Stop a request; its final output (finish_reason "abort") comes with the next step."""
        seq = self.requests.get(request_id)
        if seq is None:
            return False
        self._finish(seq, FinishReason.ABORT)
        self._pending.append(self._output(seq))
        return True

    def has_unfinished(self) -> bool:
        return bool(self.requests or self._pending or self._inflight)

    # --- the loop ----------------------------------------------------------------------
    def step(self) -> list[RequestOutput]:
        """Schedule and launch a step, then retire the step before it (overlap) or this one;
        returns the outputs of requests that moved.

        With overlap, step k+1 is scheduled, prepared and launched before the host reads
        step k's tokens: its inputs take them from the device (`PendingTokens`), and the
        host reads them (the one sync) while step k+1 runs. A sequence that step k finishes
        is therefore retired one step late: it computed one more position at k+1, whose
        sample is dropped, so the tokens are those without overlap. A step holding a
        constrained row is retired at once (the grammar needs its token on the host to build
        the next bitmask), so such steps run without overlap."""
        outputs, self._pending = self._pending, []
        started = time.perf_counter()
        try:
            prefilled = self._step(outputs)
        except BaseException:
            self._pending = outputs + self._pending  # for `recover`: nothing is lost
            raise
        self._stepping = []
        if prefilled:
            # Steps that prefill: what the gateway divides waiting prompt tokens by.
            self.prefill_rate.observe(prefilled, time.perf_counter() - started)
        return outputs

    def _step(self, outputs: list[RequestOutput]) -> int:
        """One step; returns the tokens it scheduled if any chunk prefilled (else 0)."""
        self._collect_fetches(outputs)
        self._collect_grammars(outputs)
        if self.speculator is not None:
            self.speculator.propose(self.scheduler.running, self.config.max_model_len)
        scheduled = self.scheduler.schedule()
        tokens = sum(chunk.num_tokens for chunk in scheduled.chunks)
        # A decode's chunk with drafts is no prefill.
        prefills = any(chunk.num_tokens - chunk.num_drafts > 1 for chunk in scheduled.chunks)
        self._stepping = [chunk.seq for chunk in scheduled.chunks]
        if self._inflight is not None:
            self._stepping += self._inflight.seqs
        launched = None
        if scheduled.chunks:
            chunks, image_rows = self._checked_chunks(scheduled.chunks, outputs)
            if chunks:
                launched = self._launch(chunks, image_rows)
        if self._inflight is not None:
            self._retire(self._inflight, outputs)
            self._inflight = None
        if launched is not None and launched.verification is not None:
            # Drafts: only accepted tokens may reach the prefix cache, so retire first.
            self._retire(launched, outputs)
            self._commit(launched)
        elif launched is not None:
            self._commit(launched)
            if self.overlap and not launched.constrained:
                self._inflight = launched
            else:
                self._retire(launched, outputs)
        elif not outputs and not scheduled.chunks:
            self._wait_idle()
        return tokens if prefills and launched is not None else 0

    def _launch(self, chunks, image_rows) -> LaunchedStep:
        """Prepare and run the model and the sampler on the device; nothing waits for it."""
        if self.step_fault is not None:
            self.step_fault()
        pending = self._inflight.pending if self._inflight is not None else None
        if self.runner.host_tier is not None:  # pages copied back must be in before reads
            self.runner.host_tier.before_step()
        inputs = self.runner.prepare(chunks, pending)
        if inputs.num_drafts and self.blocks.states is not None:
            self._keep_states(inputs.sample_chunks)
        logits = self.runner.run(inputs, image_rows)
        if self.speculator is not None and self.speculator.proposer.needs_hidden:
            self._hand_hidden(chunks, inputs)
        for chunk in chunks:
            chunk.seq.num_computed_tokens += chunk.num_tokens
        seqs = [chunk.seq for chunk in inputs.sample_chunks]
        verification = draft_seqs = None
        if inputs.num_drafts:
            logits, verification, draft_seqs = self._verify(logits, inputs.sample_chunks)
        self.constraints.apply(logits, seqs)
        sample = self.sampler.sample(logits, seqs, pending)
        slots = [seq.add_placeholder() for seq in seqs]
        rows = {seq: row for row, seq in enumerate(seqs)}
        pending_tokens = PendingTokens(sample.token_ids, rows)
        return LaunchedStep(chunks, seqs, slots, sample, pending_tokens, verification, draft_seqs)

    # --- speculative decoding (llm_svc/engine/spec) ---------------------------------------
    def _keep_states(self, chunks) -> None:
        """Hybrid models: each drafting sequence's linear-layer state as it is before the
        step, kept in a spare running slot, so a rejection can roll it back exactly."""
        states = self.blocks.states
        for chunk in chunks:
            if chunk.num_drafts:
                chunk.seq.spec.backup = states.take_running()
                states.copy(chunk.seq.state_slot, chunk.seq.spec.backup)

    def _hand_hidden(self, chunks, inputs) -> None:
        """MTP: each chunk's rows of the step's last hidden states, to the proposer."""
        hidden, proposer = self.runner.last_hidden, self.speculator.proposer
        for chunk, first in zip(chunks, inputs.meta.query_starts, strict=True):
            rows = hidden[first : first + chunk.num_tokens]
            proposer.observe(chunk.seq, chunk.start, rows)
        self.runner.last_hidden = None  # the proposer keeps copies of what it needs

    def _verify(self, logits, chunks):
        """(each sampling chunk's last row, the verification of the draft rows, the
        sequences that drafted) from a step whose chunks end in 1 + num_drafts rows."""
        last, draft_rows, draft_seqs, drafts = [], [], [], []
        row = 0
        for chunk in chunks:
            if chunk.num_drafts:
                draft_rows.extend(range(row, row + chunk.num_drafts))
                draft_seqs.append(chunk.seq)
                first = chunk.start + 1
                drafts.append(chunk.seq.token_ids[first : first + chunk.num_drafts])
            row += chunk.num_drafts
            last.append(row)
            row += 1
        verification = verify(self.sampler, _rows(logits, draft_rows), draft_seqs, drafts)
        return _rows(logits, last), verification, draft_seqs

    def _settle(self, seq: Sequence, sampled: SampledToken, verdict: Verdict,
                outputs: list[RequestOutput]) -> None:  # fmt: skip
        """Accept `seq`'s verified drafts, then the replacement or the bonus token, one by
        one (a stop ends it there); then its computed length, pages and (hybrid) state
        are those of the accepted tokens alone."""
        start = seq.num_tokens - seq.num_pending - seq.num_drafts - 1
        proposed = seq.num_drafts
        drafts = seq.token_ids[start + 1 : start + 1 + proposed]
        seq.drop_placeholders()
        last = sampled.token_id if verdict.replacement is None else verdict.replacement
        for token in [*drafts[: verdict.accepted], last]:
            seq.append_token(token)
            outputs.append(self._accept(seq, SampledToken(token, None)))
            if seq.is_finished:
                break
        self.speculator.record(seq, proposed, verdict.accepted)
        if seq.is_finished:
            return
        states = self.blocks.states
        if states is not None and verdict.accepted < proposed:
            # The linear layers ran over rejected drafts: back to the state before the
            # step; the accepted tokens and the new one are computed again next step.
            states.copy(seq.spec.backup, seq.state_slot)
            seq.num_computed_tokens = start
        else:
            seq.num_computed_tokens = start + 1 + verdict.accepted
        self._release_backup(seq)
        self.blocks.trim(seq)

    def _release_backup(self, seq: Sequence) -> None:
        spec = seq.spec
        if spec is not None and spec.backup is not None:
            self.blocks.states.give_running(spec.backup)
            spec.backup = None

    def _commit(self, step: LaunchedStep) -> None:
        """Publish the step's filled pages (their tokens are all on the host by now: the
        step before has been retired)."""
        for chunk in step.chunks:
            if not chunk.seq.is_finished:
                self.blocks.commit(chunk.seq)

    def _retire(self, step: LaunchedStep, outputs: list[RequestOutput]) -> None:
        """Read the step's tokens (the host's one wait for the device) and accept them;
        sequences that ended meanwhile (finished the step before, aborted) are skipped."""
        sampled = step.sample.resolve()
        verdicts = {}
        if step.verification is not None:
            verdicts = dict(zip(step.draft_seqs, step.verification.resolve(), strict=True))
        for seq, slot, token in zip(step.seqs, step.slots, sampled, strict=True):
            if seq.is_finished:
                continue
            if seq in verdicts:
                self._settle(seq, token, verdicts[seq], outputs)
                continue
            seq.resolve_placeholder(slot, token.token_id)
            outputs.append(self._accept(seq, token))

    # --- after a failed step (llm_svc/server/step_failures.py decides which to call) ---
    def recover(self, error: Exception, recompute: bool) -> list[RequestOutput]:
        """After `step()` raised: the outputs the failed step had gathered, then the step's
        own sequences either ended with `error` (finish_reason "error") or, if `recompute`,
        put back at the head of the queue with their KV dropped, to be prefilled again.
        Sequences outside the step are untouched: the step wrote no KV of theirs."""
        stepping, self._stepping = self._stepping, []
        self._inflight = None
        outputs, self._pending = self._pending, []
        for seq in dict.fromkeys(stepping):
            if seq.is_finished:
                continue
            self._release_backup(seq)
            if recompute:
                seq.drop_placeholders()
                self.scheduler.recompute(seq)
            else:
                self._fail(seq, error, outputs)
        return outputs

    def shrink_step(self) -> bool:
        """Halve the step's token budget (after an out-of-memory step); False when it is
        already at its floor (one page) and cannot shrink."""
        floor = self.config.page_size
        budget = self.scheduler.token_budget
        if budget <= floor:
            return False
        self.scheduler.token_budget = max(floor, budget // 2)
        log.warning("step token budget shrunk %d -> %d", budget, self.scheduler.token_budget)
        return True

    def probe(self, token_id: int = 0) -> None:
        """One tiny forward, alone (one prompt token, one sampled token): raises what the
        step raised. The queued requests wait meanwhile and nothing of theirs changes."""
        scheduler = self.scheduler
        held = scheduler.waiting, scheduler.running, self._pending
        scheduler.waiting, scheduler.running, self._pending = deque(), [], []
        seq = None
        try:
            params = SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True)
            seq = self.add_request(PROBE_ID, [token_id], params)
            for _ in range(PROBE_MAX_STEPS):
                self.step()
                if seq.is_finished:
                    break
            else:
                raise RuntimeError(f"probe did not finish in {PROBE_MAX_STEPS} steps")
        except BaseException as err:
            self.recover(err if isinstance(err, Exception) else RuntimeError(), False)
            raise
        finally:
            if seq is not None and not seq.is_finished:
                self._finish(seq, FinishReason.ABORT)
            self._inflight, self._stepping = None, []
            scheduler.waiting = deque([*held[0], *scheduler.waiting])
            scheduler.running = [*held[1], *scheduler.running]
            self._pending = held[2]

    def _checked_chunks(self, chunks, outputs: list[RequestOutput]):
        """(chunks, their image rows) of the requests whose own data passes its checks;
        each other request ends here with its RequestDataError (its pages are freed, and
        nothing of this step reaches the prefix cache for it)."""
        kept, image_rows = [], []
        width = self.model_config.embedding_width
        for chunk in chunks:
            try:
                rows = chunk_image_rows(chunk, width)
            except RequestDataError as err:
                log.warning("request %s fails alone: %s", chunk.seq.request_id, err)
                self._fail(chunk.seq, err, outputs)
                continue
            kept.append(chunk)
            image_rows.append(rows)
        return kept, image_rows

    def _fail(self, seq: Sequence, error: Exception, outputs: list[RequestOutput]) -> None:
        """End `seq` alone with `error` (finish_reason "error")."""
        seq.error = error
        self._finish(seq, FinishReason.ERROR)
        outputs.append(self._output(seq))

    def _wait_idle(self) -> None:
        """Nothing could be scheduled: wait briefly for a compile or fetch to land."""
        if len(self.compiling):
            self.compiling.wait(IDLE_WAIT_S)
        elif self.fetcher is not None:
            self.fetcher.wait(IDLE_WAIT_S)

    def _collect_grammars(self, outputs: list[RequestOutput]) -> None:
        """Compiled grammars: their sequences join the queue, or end with the error."""
        if not len(self.compiling):
            return
        ready, failed = self.compiling.collect()
        for seq, error in failed:
            self._fail(seq, error, outputs)
        for seq in ready:
            self.scheduler.add(seq)

    def _collect_fetches(self, outputs: list[RequestOutput]) -> None:
        """Landed fetches: their sequences rejoin the queue, or end with the fetch's error."""
        if self.fetcher is None:
            return
        ready = []
        for result in self.fetcher.collect():
            seq = result.seq
            if result.error is not None:
                self._fail(seq, result.error, outputs)
            else:
                seq.embeddings.update(result.embeddings)
                ready.append(seq)
        self.scheduler.requeue_fetched(ready)

    def _accept(self, seq: Sequence, sampled: SampledToken) -> RequestOutput:
        """`sampled` (already in `seq.token_ids`) extends the output; stops are checked."""
        if seq.num_output_tokens == 1:
            self._hit_tokens += seq.num_cached_tokens
        self._generated_tokens += 1
        if seq.grammar is not None:
            try:
                seq.grammar.accept(sampled.token_id)
            except GrammarViolation as err:  # a bug, not the client's: end this request only
                log.error("request %s: %s", seq.request_id, err)
                seq.error = err
                self._finish(seq, FinishReason.ERROR)
                return self._output(seq)
        if sampled.logprobs is not None:
            seq.logprobs.append(sampled.logprobs)
        text_before = len(seq.text)
        if self._is_stop_token(seq.params, sampled.token_id) and not (
            seq.params.include_stop_str_in_output
        ):
            # A stop token ends the text without being part of it (as vLLM), also when
            # special tokens are kept (EOS would otherwise read `</s>`).
            seq.text += seq.detokenizer.flush()
        else:
            seq.text += seq.detokenizer.add(sampled.token_id)
        reason = self._stop_reason(seq, sampled.token_id)
        if reason is not None:
            seq.text += seq.detokenizer.flush()
        # Stop strings count only from min_tokens on (as vLLM: the end is held back before).
        stops_count = seq.num_output_tokens >= seq.params.min_tokens
        if seq.params.stop and stops_count and self._trim_stop_string(seq, text_before):
            reason = FinishReason.STOP
        if reason is not None:
            self._finish(seq, reason)
        return self._output(seq)

    def _is_stop_token(self, params, token: int) -> bool:
        return token in params.stop_token_ids or (
            not params.ignore_eos and token in self.eos_token_ids
        )

    def _stop_reason(self, seq: Sequence, token: int) -> FinishReason | None:
        """Why `seq` ends after `token` (stop strings aside), or None."""
        params = seq.params
        if seq.grammar is not None and seq.grammar.terminated:
            return FinishReason.STOP
        if self._is_stop_token(params, token):
            return FinishReason.STOP
        if seq.num_output_tokens >= params.max_tokens:
            return FinishReason.LENGTH
        if seq.num_prompt_tokens + seq.num_output_tokens >= self.config.max_model_len:
            return FinishReason.LENGTH
        return None

    @staticmethod
    def _trim_stop_string(seq: Sequence, text_before: int) -> bool:
        stops = seq.params.stop
        start = max(0, text_before - max(map(len, stops)) + 1)
        found = [(seq.text.find(stop, start), stop) for stop in stops]
        found = [(index, stop) for index, stop in found if index >= 0]
        if not found:
            return False
        index, stop = min(found)
        keep = len(stop) if seq.params.include_stop_str_in_output else 0
        seq.text = seq.text[: index + keep]
        return True

    def _finish(self, seq: Sequence, reason: FinishReason) -> None:
        seq.drop_placeholders()
        self._release_backup(seq)
        if self.speculator is not None:
            self.speculator.proposer.forget(seq)
        seq.status = SequenceStatus.FINISHED
        seq.finish_reason = reason
        self.scheduler.finish(seq)
        self.compiling.discard(seq)
        if self.fetcher is not None:
            self.fetcher.release(seq)
        del self.requests[seq.request_id]

    def _output(self, seq: Sequence) -> RequestOutput:
        params = seq.params
        visible = len(seq.text)
        if not seq.is_finished and params.stop and not params.include_stop_str_in_output:
            # Hold back what could still become the start of a stop string.
            visible = max(seq.num_text_emitted, visible - (max(map(len, params.stop)) - 1))
        new_text = seq.text[seq.num_text_emitted : visible]
        seq.num_text_emitted = visible
        first = seq.num_tokens_emitted
        seq.num_tokens_emitted = seq.num_output_tokens
        return RequestOutput(
            request_id=seq.request_id,
            new_token_ids=seq.output_token_ids[first:],
            new_text=new_text,
            finished=seq.is_finished,
            finish_reason=seq.finish_reason.value if seq.finish_reason else None,
            new_logprobs=seq.logprobs[first:],
            num_prompt_tokens=seq.num_prompt_tokens,
            num_cached_tokens=seq.num_cached_tokens,
            error=seq.error,
        )

    def reset_prefix_cache(self, announce: bool = True) -> int:
        """Drop every cached prefix page no running request holds; returns the pages freed.
        `announce=False` publishes no REMOVED events for them (a test hook)."""
        return self.blocks.drop_cached(announce)

    # --- observability -----------------------------------------------------------------
    def take_kv_events(self) -> list[KVEvent]:
        """Stored / removed / tier-move page events since the last call (none without
        prefix caching); pages the KV store's writer has written since, last."""
        if self.blocks.cache is None:
            return []
        events = self.blocks.cache.take_events()
        if self.kv_store is not None:
            events.extend(StoreStored(block) for block in self.kv_store.take_written())
        return events

    def stats(self) -> EngineStats:
        return EngineStats(
            running=len(self.scheduler.running),
            waiting=len(self.scheduler.waiting) + self.scheduler.num_fetching + len(self.compiling),
            kv_utilisation=self.blocks.utilisation,
            num_pages=self.blocks.num_pages,
            sequence_capacity=self.blocks.sequence_capacity(self.config.max_model_len),
            pending_prefill_tokens=self.scheduler.pending_prefill_tokens(),
            preemptions=self.scheduler.num_preemptions,
            prompt_tokens=self._prompt_tokens,
            prefix_hit_tokens=self._hit_tokens,
            generation_tokens=self._generated_tokens,
            tier=self._tier_stats(),
            store=self._store_stats(),
            rates=self._rates(),
            **self._snapshot_stats(),
            **self._spec_stats(),
        )

    def _rates(self) -> EngineRates:
        """The measured rates GetLoad reports (0: none measured yet)."""
        host, store = self.runner.host_tier, self.kv_store
        return EngineRates(
            prefill_tokens_per_s=self.prefill_rate.per_second,
            host_load_bytes_per_s=host.stats.load_rate.per_second if host else 0.0,
            store_fetch_bytes_per_s=store.fetch_rate.per_second if store else 0.0,
            kv_bytes_per_token=host.unit_bytes(PAGE) // self.config.page_size if host else 0,
            kv_store=store is not None,
        )

    def _tier_stats(self) -> TierSnapshot | None:
        """The host tier's counters, copied; the load times recorded since the last call
        are taken out (the engine thread is their only writer and this their only reader)."""
        host = self.runner.host_tier
        if host is None:
            return None
        stats = host.stats
        load_seconds = tuple(stats.load_seconds)
        stats.load_seconds.clear()
        return TierSnapshot(
            page_lookups=dict(stats.page_lookups),
            hits=dict(stats.hits),
            misses=dict(stats.misses),
            bytes_to_host=stats.bytes_to_host,
            bytes_to_device=stats.bytes_to_device,
            load_failures=stats.load_failures,
            dropped_full=stats.dropped_full,
            host_hit_tokens=stats.host_hit_tokens,
            load_seconds=load_seconds,
            fill=host.fill,
            capacity_bytes=host.sizing.total_bytes,
        )

    def _store_stats(self) -> StoreSnapshot | None:
        """The KV store client's counters, copied; the lookup times recorded since the last
        call are taken out (lookups run on the engine thread, as this does: nothing appends
        meanwhile). The writer thread adds to the other counters: an int read is atomic."""
        store = getattr(self, "kv_store", None)
        if store is None:
            return None
        stats = store.stats
        fetch_seconds = tuple(stats.fetch_seconds)
        del stats.fetch_seconds[: len(fetch_seconds)]
        return StoreSnapshot(
            hits=stats.hits,
            misses=stats.misses,
            bytes_read=stats.bytes_read,
            bytes_written=stats.bytes_written,
            checksum_failures=stats.checksum_failures,
            dropped_writes=stats.dropped_writes,
            skipped_writes=stats.skipped_writes,
            errors=stats.errors,
            available=stats.available,
            fetch_seconds=fetch_seconds,
        )

    def _spec_stats(self) -> dict[str, dict[str, int]]:
        if self.speculator is None:
            return {}
        stats = self.speculator.stats
        return dict(
            spec_proposed=dict(stats.proposed),
            spec_accepted=dict(stats.accepted),
            spec_verifications=dict(stats.verifications),
        )

    def _snapshot_stats(self) -> dict[str, int]:
        states = self.blocks.states
        if states is None:
            return {}
        return dict(
            snapshot_slots=states.snapshot_slots,
            snapshots_held=states.snapshot_slots - states.num_free_snapshots,
            snapshots_skipped=self.blocks.num_snapshots_skipped,
        )
