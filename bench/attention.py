"""`bench/engine.py --only attention`: the Triton attention backend against SDPA, side by side.

Two measurements, both on a CUDA device:
1. One step's attention (plan + every layer's forward) through each backend on the same
   paged cache: a decode batch over long contexts, and a step of prefill chunks over cached
   prefixes. `ratio R` = SDPA time / Triton time (above 1: Triton is faster).
2. The engine's output tokens per second with each backend on the same greedy requests.

On a CPU there is nothing honest to measure: Triton has no CPU driver, and its interpreter
is a correctness tool, so the section says so and measures nothing.
"""

from __future__ import annotations

import time

import torch

from llm_svc.engine import EngineConfig, LLMEngine
from llm_svc.engine.attention import AttentionMetadata, KVCache
from llm_svc.engine.attention.sdpa import SdpaBackend
from llm_svc.engine.attention.triton import TritonBackend

# An 8B-class layer: 32 query heads over 8 kv heads of 128, bf16, 16-token pages.
HEADS, KV_HEADS, HEAD_DIM, LAYERS, PAGE = 32, 8, 128, 8, 16
DECODE_STEP = [(2048, 1)] * 48 + [(8192, 1)] * 16  # (context, query) per sequence
EXTEND_STEP = [(1536 + 512, 512)] * 3 + [(700, 700), (96, 1)] * 2


def step_inputs(seqs, device: torch.device, dtype: torch.dtype, seed: int = 0):
    """A random paged cache with shuffled pages, the step's metadata and its q/k/v."""
    generator = torch.Generator().manual_seed(seed)
    pages = sum(-(-context // PAGE) for context, _ in seqs)
    cache = KVCache.allocate(LAYERS, pages, PAGE, KV_HEADS, HEAD_DIM, dtype, device)
    cache.k.normal_()
    cache.v.normal_()
    order = torch.randperm(pages, generator=generator).tolist()
    tables, slots, starts, flat = [], [], [], 0
    for context, query in seqs:
        table = [order.pop() for _ in range(-(-context // PAGE))]
        tables.append(table)
        slots += [table[p // PAGE] * PAGE + p % PAGE for p in range(context - query, context)]
        starts.append(flat)
        flat += query
    width = max(len(table) for table in tables)
    meta = AttentionMetadata(
        slot_mapping=torch.tensor(slots, device=device),
        query_starts=starts,
        query_lens=[query for _, query in seqs],
        context_lens=[context for context, _ in seqs],
        block_tables=torch.tensor([t + [0] * (width - len(t)) for t in tables], device=device),
    )
    q = torch.randn(flat, HEADS, HEAD_DIM, device=device, dtype=dtype)
    kv = torch.randn(flat, KV_HEADS, HEAD_DIM, device=device, dtype=dtype)
    return cache, meta, q, kv


def time_step(backend, meta, q, kv, repeats: int) -> float:
    """Best wall time of plan + LAYERS forwards, waiting for the device each time."""

    def once() -> None:
        backend.plan(meta)
        for layer in range(LAYERS):
            backend.forward(layer, q, kv, kv)

    once()  # warm-up: compiles the Triton kernels for these shapes
    best = float("inf")
    for _ in range(repeats):
        torch.cuda.synchronize()
        start = time.perf_counter()
        once()
        torch.cuda.synchronize()
        best = min(best, time.perf_counter() - start)
    return best


def bench_kernels(device: torch.device, repeats: int) -> None:
    for label, seqs in (("decode", DECODE_STEP), ("extend", EXTEND_STEP)):
        cache, meta, q, kv = step_inputs(seqs, device, torch.bfloat16)
        times = {}
        # Alternate the backends so a busy spell slows both alike; keep each one's best.
        for _ in range(2):
            for backend in (TritonBackend(cache), SdpaBackend(cache)):
                best = time_step(backend, meta, q, kv, repeats)
                times[backend.name] = min(times.get(backend.name, best), best)
        tokens = sum(query for _, query in seqs)
        print(f"attention {label}: {len(seqs)} sequences, {tokens} query tokens, "
              f"{LAYERS} layers of {HEADS}/{KV_HEADS} heads x {HEAD_DIM}, bf16: "
              f"triton {times['triton'] * 1e3:.2f} ms, "
              f"sdpa {times['sdpa'] * 1e3:.2f} ms")  # fmt: skip
        print(
            f"ratio R {times['sdpa'] / times['triton']:.2f}  attention {label} step, "
            "sdpa / triton time"
        )


def bench_engines(directory, args, requests) -> None:
    from bench.engine import clear_prefix_cache, make_requests, run_engine

    rates = {}
    for name in ("triton", "sdpa"):
        config = EngineConfig(directory, device="cuda", max_num_seqs=args.batch,
                              max_num_batched_tokens=512, kv_cache_bytes=2 << 30,
                              attention_backend=name)  # fmt: skip
        engine = LLMEngine(config)
        assert engine.runner.backend.name == name, engine.runner.backend.name
        vocab = engine.model_config.vocab_size
        run_engine(engine, make_requests(2, vocab, 1, 32, 4))  # warm-up (and compiles)
        best = float("inf")
        for _ in range(args.repeats):
            clear_prefix_cache(engine)
            best = min(best, run_engine(engine, requests(vocab)))
        rates[name] = sum(out_len for _, out_len in requests(vocab)) / best
        engine.close()
        print(f"engine with {name:6s} attention {rates[name]:8.1f} output tok/s")
    print(
        f"ratio R {rates['triton'] / rates['sdpa']:.2f}  engine output tokens per second, "
        "triton / sdpa attention"
    )


def bench_attention(directory, args) -> None:
    """The `--only attention` section (see the module docstring)."""
    from bench.engine import make_requests

    device = (
        args.device if args.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
    )
    if device != "cuda" or not torch.cuda.is_available():
        print(f"attention: cannot measure the Triton backend on {device}: Triton has no CPU "
              "driver (its interpreter checks correctness, not speed); run with --device cuda "
              "on a machine with a GPU. Nothing measured.")  # fmt: skip
        return
    bench_kernels(torch.device("cuda"), args.repeats)

    def requests(vocab):
        return make_requests(args.requests, vocab, 0, args.max_prompt, args.max_out)

    bench_engines(directory, args, requests)
