"""Engine configuration: one dataclass, checked when built."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from iris.mtls import TLSFiles
from llm_svc.engine.attention import check_backend_name
from llm_svc.engine.kv_store import KVStoreConfig
from llm_svc.engine.models.config import TextModelConfig
from llm_svc.engine.models.gated_deltanet import KERNEL_CHOICES
from llm_svc.engine.parallel.checks import check_tensor_parallel

_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
DEFAULT_CPU_KV_BYTES = 512 << 20


# Draft methods (llm_svc/engine/spec). MTP heads (Qwen3.5) are not implemented yet.
SPECULATIVE_METHODS = ("ngram", "mtp")


@dataclass
class EngineConfig:
    """Knobs of one engine. `max_model_len` None = the model's max_position_embeddings,
    lowered at start (with a warning) to the longest sequence a sliding-window model's KV
    budget holds; a set one that does not fit is refused then.
    The KV cache holds `num_pages` pages if given, else as many as fit in
    `kv_cache_bytes`, else what the memory budget leaves (llm_svc/engine/memory_budget.py:
    on CUDA `gpu_memory_utilization` × the device's memory − weights − a profiled step's
    peak − `max_held_embedding_bytes` − memory outside torch; on CPU the same against
    `memory_budget_bytes`, whose default leaves the KV cache 512 MiB). Image embeddings
    held by running requests never exceed `max_held_embedding_bytes`: admission waits.
    device / dtype "auto": CUDA + bfloat16 when a GPU is present, else CPU + float32.
    `attention_backend` "auto": the Triton kernels on CUDA, SDPA on CPU; "triton" or
    "sdpa" forces one (Triton falls back to SDPA, with a warning, for a head dim or dtype
    its kernels do not cover).

    Images: with `cache_address` (host:port of the embedding cache) the engine fetches
    embeddings from it, waiting up to `embedding_wait_s` for an image still being encoded,
    each cache call bounded by `cache_timeout_s`; `embedding_fetch_workers` threads fetch
    off the engine loop. Without it, only an embedding source passed to LLMEngine (the
    offline LLM's in-process vision tower) lets requests carry images.

    Constraints (structured output): a constraint's text is at most `grammar_max_bytes`,
    its JSON nests at most `grammar_max_depth` levels; `grammar_compile_threads` worker
    processes (`grammar_worker_module`) compile off the engine's process, a compile is
    killed with its worker `grammar_compile_timeout_s` after it starts, a request waits at
    most `grammar_queue_timeout_s` for its grammar (queue and compile together), a failed
    compile is remembered for `grammar_failure_ttl_s`, and `grammar_cache_entries` compiled
    grammars are kept.

    `overlap_scheduling`: schedule and prepare step k+1 while step k runs on the device
    (LLMEngine.step); None = on for CUDA, off for CPU, where the device is the host's own
    cores and nothing runs in parallel (bench/engine.py --only overlap measures it).

    `tensor_parallel_size` ranks split the model (llm_svc/engine/parallel): one process
    each, this one rank 0; a rank that dies or does not answer a collective within
    `tensor_parallel_timeout_s` fails the engine (RankFailedError). The size must divide
    the attention heads and the MLP width, divide or be a multiple of the KV heads, not
    exceed the CUDA devices, and be 1 for a quantized checkpoint.

    Hybrid models (linear attention, Qwen3.5): the prefix cache keeps a snapshot of the
    linear layers' states every `state_snapshot_interval` pages (k); a hit resumes from the
    deepest snapshot, so a larger k costs less memory per cached page and resumes less deep
    (docs/design/engine.md). `linear_attention_kernels` runs their gated delta
    rule: "auto" fla-core's Triton kernels on CUDA when installed (the `cuda` extra), else
    torch; "torch" or "fla" forces one (fla on CUDA only, and an error without fla-core).

    Speculative decoding (llm_svc/engine/spec; docs/design/engine.md): up to
    `num_speculative_tokens` drafts per decoding sequence (0: off) from
    `speculative_method` ("ngram"; "mtp": a Qwen3.5 checkpoint's own MTP layer, at
    tensor_parallel_size 1), verified in one target forward; a sequence whose recent
    acceptance is below `speculative_min_acceptance` pauses drafting (0: never), and a
    batch of `speculative_max_batch` or more running sequences decodes without drafts. It
    turns overlap scheduling off (a step's accepted tokens decide the next step's inputs);
    asking for both is refused."""

    model_dir: str | Path
    model_revision: str = ""  # the weights' name for the fingerprint ("": their digest)
    page_size: int = 16
    max_num_seqs: int = 32
    max_num_batched_tokens: int = 512
    max_model_len: int | None = None
    # Whether max_model_len was set (None: decided by __post_init__, and kept by
    # dataclasses.replace): an unset one may be lowered at start to what the KV budget
    # holds (docs/design/engine.md "Pages per layer kind", rule (a)).
    max_model_len_given: bool | None = None
    num_pages: int | None = None
    kv_cache_bytes: int | None = None
    # Host memory for pages the device pools let go (llm_svc/engine/host_tier.py); 0: off.
    host_kv_bytes: int = 0
    # The KV store shared by the pods (llm_svc/engine/kv_store.py); None: off. Needs the
    # host tier, which its pages are loaded into.
    kv_store: KVStoreConfig | None = None
    gpu_memory_utilization: float = 0.9
    memory_budget_bytes: int | None = None
    max_held_embedding_bytes: int = 1 << 30
    device: str = "auto"
    dtype: str = "auto"
    enable_prefix_caching: bool = True
    attention_backend: str = "auto"
    overlap_scheduling: bool | None = None
    seed: int = 0
    tokenizer_dir: str | Path | None = None
    cache_address: str | None = None
    cache_tls: TLSFiles | None = None  # mutual TLS to the cache (iris/mtls); None: plaintext
    embedding_wait_s: float = 30.0
    cache_timeout_s: float = 5.0
    embedding_fetch_workers: int = 4
    grammar_max_bytes: int = 64 << 10
    grammar_max_depth: int = 32
    grammar_compile_timeout_s: float = 3.0
    grammar_queue_timeout_s: float = 7.0
    grammar_failure_ttl_s: float = 300.0
    grammar_compile_threads: int = 2
    grammar_cache_entries: int = 256
    grammar_worker_module: str = "llm_svc.engine.grammar.worker"
    tensor_parallel_size: int = 1
    tensor_parallel_timeout_s: float = 60.0
    state_snapshot_interval: int = 16
    linear_attention_kernels: str = "auto"
    num_speculative_tokens: int = 0
    speculative_method: str = "ngram"
    speculative_min_acceptance: float = 0.3
    speculative_max_batch: int = 32

    def __post_init__(self) -> None:
        self.model_dir = Path(self.model_dir)
        if not (self.model_dir / "config.json").is_file():
            raise ValueError(f"model_dir {self.model_dir} has no config.json")
        self.tokenizer_dir = Path(self.tokenizer_dir or self.model_dir)
        for name in (
            "embedding_wait_s",
            "cache_timeout_s",
            "grammar_compile_timeout_s",
            "grammar_queue_timeout_s",
            "grammar_failure_ttl_s",
            "tensor_parallel_timeout_s",
        ):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")
        for name in (
            "page_size",
            "max_num_seqs",
            "max_num_batched_tokens",
            "embedding_fetch_workers",
            "grammar_max_bytes",
            "grammar_max_depth",
            "grammar_compile_threads",
            "grammar_cache_entries",
            "max_held_embedding_bytes",
            "state_snapshot_interval",
        ):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.num_pages is not None and self.num_pages < 1:
            raise ValueError(f"num_pages must be >= 1, got {self.num_pages}")
        if self.memory_budget_bytes is not None and self.memory_budget_bytes < 1:
            raise ValueError(f"memory_budget_bytes must be >= 1, got {self.memory_budget_bytes}")
        if self.host_kv_bytes < 0:
            raise ValueError(f"host_kv_bytes must be >= 0, got {self.host_kv_bytes}")
        if self.kv_store is not None:
            if not self.host_kv_bytes or not self.enable_prefix_caching:
                raise ValueError(
                    "a kv store (IRIS_LLM_KV_STORE) needs the prefix cache and the host tier "
                    "(IRIS_LLM_HOST_KV_BYTES > 0): its pages are loaded into the host tier"
                )
            if self.tensor_parallel_size > 1:
                raise ValueError(
                    f"a kv store (IRIS_LLM_KV_STORE) is not supported with "
                    f"tensor_parallel_size {self.tensor_parallel_size}: every rank would "
                    f"have to find its own shard of each page; use 1"
                )
        if self.kv_cache_bytes is not None and self.kv_cache_bytes < 1:
            raise ValueError(f"kv_cache_bytes must be >= 1, got {self.kv_cache_bytes}")
        if not 0.0 < self.gpu_memory_utilization <= 1.0:
            raise ValueError(
                f"gpu_memory_utilization must be in (0, 1], got {self.gpu_memory_utilization}"
            )
        if self.device == "auto":
            self.device = "cuda" if torch.cuda.is_available() else "cpu"
        self._check_speculation()
        if self.overlap_scheduling is None:
            self.overlap_scheduling = self.device.startswith("cuda")
        if self.dtype == "auto":
            self.dtype = "bfloat16" if self.device.startswith("cuda") else "float32"
        check_backend_name(self.attention_backend)
        if self.linear_attention_kernels not in KERNEL_CHOICES:
            raise ValueError(
                f"linear_attention_kernels must be one of {KERNEL_CHOICES}, "
                f"got {self.linear_attention_kernels}"
            )
        check_tensor_parallel(self.model_dir, self.tensor_parallel_size, self.device)
        if self.dtype not in _DTYPES:
            raise ValueError(f"dtype must be one of {sorted(_DTYPES)} or auto, got {self.dtype}")
        model = TextModelConfig.from_model_dir(self.model_dir)
        limit = model.max_position_embeddings
        if self.max_model_len_given is None:
            self.max_model_len_given = self.max_model_len is not None
        if self.max_model_len is None:
            self.max_model_len = limit
        if not 1 < self.max_model_len <= limit:
            raise ValueError(
                f"max_model_len must be in [2, {limit}] for this model, got {self.max_model_len}"
            )

    def _check_speculation(self) -> None:
        if self.num_speculative_tokens < 0:
            raise ValueError(
                f"num_speculative_tokens must be >= 0, got {self.num_speculative_tokens}"
            )
        if self.speculative_method not in SPECULATIVE_METHODS:
            raise ValueError(
                f"speculative_method must be one of {SPECULATIVE_METHODS}, "
                f"got {self.speculative_method!r}"
            )
        if not 0.0 <= self.speculative_min_acceptance <= 1.0:
            raise ValueError(
                "speculative_min_acceptance must be in [0, 1], "
                f"got {self.speculative_min_acceptance}"
            )
        if self.speculative_max_batch < 1:
            raise ValueError(
                f"speculative_max_batch must be >= 1, got {self.speculative_max_batch}"
            )
        mtp = self.num_speculative_tokens and self.speculative_method == "mtp"
        if mtp and self.tensor_parallel_size > 1:
            raise ValueError(
                f"speculative_method 'mtp' is not supported with tensor_parallel_size "
                f"{self.tensor_parallel_size} yet: use 1, or speculative_method 'ngram'"
            )
        if self.num_speculative_tokens:
            # The accepted tokens decide the next step's inputs: nothing to overlap.
            if self.overlap_scheduling:
                raise ValueError(
                    f"overlap_scheduling (IRIS_LLM_OVERLAP_SCHEDULING) cannot be on with "
                    f"num_speculative_tokens {self.num_speculative_tokens}: a step's accepted "
                    f"drafts decide the next step's inputs; leave it unset or set it false"
                )
            self.overlap_scheduling = False

    @property
    def torch_dtype(self) -> torch.dtype:
        return _DTYPES[self.dtype]
