"""Decoder families against HF `generate` (`python bench/engine.py --only families`).

For each family (Qwen3, Qwen3-MoE, Qwen2-MoE, Gemma 3's and Gemma 4's text models, Gemma 4
dense and with its MoE block) a random checkpoint at
the demo model's size (SmolLM2-135M's shape: hidden 576, 30 layers, 9 heads, 3 KV heads,
head dim 64, MLP width 1536, tied embeddings, the demo tokenizer's vocabulary) is built
once with transformers and cached. The MoE families have 8 experts of that width, top-2
(renormalised), on every layer; Qwen2-MoE adds its shared expert, also of that width. Gemma
3 has its 5 sliding (window 512) : 1 global layer pattern; so has Gemma 4, its full layers
head dim 128 with one KV head and keys equal values, and the MoE one 8 experts of that
width, top-2, beside every dense MLP.

Measured side by side in one process, on the CPU, float32, one torch thread, alternating
engine and HF and keeping each one's best (bench/engine.py part 1's method):
- decode throughput, the headline: N greedy requests with mixed prompt and output lengths,
  the engine (continuous batching, max batch B) against HF's static-batch `generate` in
  batches of B, padded left, each batch running to its longest output; output tokens asked
  for, per second;
- per-step decode at equal batch (context for the ratio): B requests of one prompt length,
  the engine's decode timed from the step after every request has its first token, HF's as
  `generate(N new)` minus `generate(1 new)`, both over the B x (N - 1) tokens after the
  first. Here the two run the same matmuls, so this shows the engine's per-step overhead
  against HF's, not its scheduling.

Then one count, not a timing (so valid on a loaded machine; `--families-pages` runs it
alone): the KV pages one sequence holds while it decodes at 4 x the window, on a tiny Gemma
3 text model with the 5 sliding : 1 full pattern (window 64 pages of 1 token), as the
layer-weighted sum over both pools (full-attention layers x full pages + sliding layers x
window pages) against every layer holding every page, as full attention would. And the
same count on a tiny Gemma 4 text model (12 layers, 5 sliding : 1 full, full layers twice
as wide, the last 6 reading earlier layers' KV) against the same model without KV sharing:
the bytes of the pages one sequence holds, each pool's pages at its own page bytes.
"""

from __future__ import annotations

import random
import time
from pathlib import Path

import torch

from bench.engine import clear_prefix_cache, make_requests, run_engine, run_hf
from llm_svc.engine import EngineConfig, LLMEngine, SamplingParams

FAMILIES = ("qwen3", "qwen3_moe", "qwen2_moe", "gemma3_text", "gemma4_text", "gemma4_text_moe")
VERSION = "v1"
SHAPE = dict(
    hidden_size=576,
    intermediate_size=1536,
    num_hidden_layers=30,
    num_attention_heads=9,
    num_key_value_heads=3,
    head_dim=64,
    max_position_embeddings=2048,
    tie_word_embeddings=True,
    initializer_range=0.02,
)
MOE = dict(num_experts=8, num_experts_per_tok=2, moe_intermediate_size=1536, norm_topk_prob=True)
EXTRA = {
    "qwen3": {},
    "qwen3_moe": MOE,
    "qwen2_moe": {**MOE, "shared_expert_intermediate_size": 1536},
    "gemma3_text": {"query_pre_attn_scalar": 64, "sliding_window": 512},
}
# Gemma 4 as the 26B-A4B and 31B are shaped (no per-layer embeddings nor KV sharing): full
# layers twice as wide with one KV head, keys equal values on them, 5 sliding : 1 full.
GEMMA4 = {
    "sliding_window": 512, "global_head_dim": 128, "num_global_key_value_heads": 1,
    "attention_k_eq_v": True, "hidden_size_per_layer_input": 0, "num_kv_shared_layers": 0,
}  # fmt: skip
EXTRA["gemma4_text"] = GEMMA4
EXTRA["gemma4_text_moe"] = {
    **GEMMA4, "enable_moe_block": True, "num_experts": 8, "top_k_experts": 2,
    "moe_intermediate_size": 1536,
}  # fmt: skip
CLASSES = {
    "qwen3": "Qwen3", "qwen3_moe": "Qwen3Moe", "qwen2_moe": "Qwen2Moe",
    "gemma3_text": "Gemma3Text", "gemma4_text": "Gemma4Text", "gemma4_text_moe": "Gemma4Text",
}  # fmt: skip


def family_model(arch: str, cache_root: Path, tokenizer_dir: Path) -> Path:
    """Build (once) `arch` at the demo's size, with the demo tokenizer."""
    import transformers as tf

    from iris.models.build import build_atomically

    stem = CLASSES[arch]
    config_cls = getattr(tf, f"{stem}Config")
    model_cls = getattr(tf, f"{stem.removesuffix('Text')}ForCausalLM")

    def build(directory: Path) -> None:
        tokenizer = tf.AutoTokenizer.from_pretrained(str(tokenizer_dir))
        torch.manual_seed(0)
        config = config_cls(vocab_size=len(tokenizer), **SHAPE, **EXTRA[arch])
        config.architectures = [model_cls.__name__]
        model_cls(config).save_pretrained(directory)
        tokenizer.save_pretrained(directory)

    return build_atomically(cache_root / f"bench-family-{arch}-{VERSION}", build)


def prompts(batch: int, length: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(100, 30000) for _ in range(length)] for _ in range(batch)]


def engine_decode(engine: LLMEngine, batch: list[list[int]], new: int) -> tuple[float, int]:
    """(seconds, tokens) of the decode steps after every request has its first token."""
    for index, prompt in enumerate(batch):
        params = SamplingParams(temperature=0.0, max_tokens=new, ignore_eos=True)
        engine.add_request(f"d{time.monotonic_ns()}-{index}", prompt, params)
    started: set[str] = set()
    while len(started) < len(batch):
        started.update(out.request_id for out in engine.step() if out.new_token_ids)
    tokens, start = 0, time.perf_counter()
    while engine.has_unfinished():
        tokens += sum(len(out.new_token_ids) for out in engine.step())
    return time.perf_counter() - start, tokens


def hf_generate(model, batch: list[list[int]], new: int) -> float:
    ids = torch.tensor(batch)
    start = time.perf_counter()
    with torch.inference_mode():
        model.generate(
            input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=new,
            min_new_tokens=new, do_sample=False, pad_token_id=0,
        )  # fmt: skip
    return time.perf_counter() - start


def hf_decode(model, batch: list[list[int]], new: int) -> tuple[float, int]:
    """(seconds, tokens) of HF's decode: `new` tokens less the first (prefill + 1 token)."""
    return hf_generate(model, batch, new) - hf_generate(model, batch, 1), len(batch) * (new - 1)


PAGES_WINDOW = 64  # tokens = pages (page size 1)


def window_pages_ratio(cache_root: Path) -> tuple[float, int, int]:
    """(ratio, full pages, window pages) of one sequence decoding at 4 x the window."""
    from iris.models.build import build_atomically
    from iris.models.text_tiny import build

    kinds = ["sliding_attention"] * 5 + ["full_attention"]
    directory = build_atomically(
        cache_root / f"bench-gemma3-5to1-w{PAGES_WINDOW}-{VERSION}",
        lambda out: build("gemma3_text", out, num_hidden_layers=6,
                          sliding_window=PAGES_WINDOW, layer_types=kinds),
    )  # fmt: skip
    config = EngineConfig(
        directory, page_size=1, max_num_batched_tokens=PAGES_WINDOW // 10, num_pages=1024,
        max_num_seqs=1, enable_prefix_caching=False, device="cpu", dtype="float32",
    )  # fmt: skip
    engine = LLMEngine(config)
    windows, end = engine.blocks.windows, 4 * PAGES_WINDOW
    prompt = [(7 * i) % 50 + 3 for i in range(end - 8)]
    seq = engine.add_request("pages", prompt, SamplingParams(temperature=0.0, max_tokens=16,
                                                             ignore_eos=True))  # fmt: skip
    while seq.num_computed_tokens < end - 1:  # the step computing position 4W - 1 is next
        engine.step()
    windows.peak_held = 0
    engine.step()
    full, window = len(seq.block_table), windows.peak_held
    engine.abort("pages")
    engine.close()
    return (1 * full + 5 * window) / (6 * full), full, window


def _held_bytes(directory: Path) -> tuple[int, int, int]:
    """(bytes, full pages, window pages) one sequence holds decoding at 4 x the window."""
    config = EngineConfig(
        directory, page_size=1, max_num_batched_tokens=PAGES_WINDOW // 10, num_pages=1024,
        max_num_seqs=1, enable_prefix_caching=False, device="cpu", dtype="float32",
    )  # fmt: skip
    engine = LLMEngine(config)
    runner, windows, end = engine.runner, engine.blocks.windows, 4 * PAGES_WINDOW
    prompt = [(7 * i) % 50 + 3 for i in range(end - 8)]
    params = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True)
    seq = engine.add_request("pages", prompt, params)
    while seq.num_computed_tokens < end - 1:
        engine.step()
    windows.peak_held = 0
    engine.step()
    full, window = len(seq.block_table), windows.peak_held
    held = full * runner.kv_bytes_per_page(runner.full_layers)
    held += window * runner.kv_bytes_per_page(runner.sliding_layers)
    engine.abort("pages")
    engine.close()
    return held, full, window


def gemma4_sharing_bytes(cache_root: Path) -> tuple[int, int]:
    """(bytes held with KV sharing, bytes held without) on the tiny Gemma 4 text model."""
    from iris.models.build import build_atomically
    from iris.models.text_tiny import build

    kinds = (["sliding_attention"] * 5 + ["full_attention"]) * 2
    held = []
    for shared in (6, 0):
        directory = build_atomically(
            cache_root / f"bench-gemma4-shared{shared}-w{PAGES_WINDOW}-{VERSION}",
            lambda out, shared=shared: build(
                "gemma4_text", out, num_hidden_layers=12, sliding_window=PAGES_WINDOW,
                layer_types=kinds, num_kv_shared_layers=shared,
            ),
        )  # fmt: skip
        held.append(_held_bytes(directory)[0])
    return held[0], held[1]


def bench_gemma4_sharing(cache_root: Path) -> None:
    shared, alone = gemma4_sharing_bytes(cache_root)
    print(
        f"KV bytes held per sequence at 4 x the window during decode (Gemma 4 text, 12 "
        f"layers, 5 sliding : 1 full, window {PAGES_WINDOW}): with the last 6 layers reusing "
        f"KV {shared}, without KV sharing {alone}; shared / unshared = {shared / alone:.3f}"
    )


def bench_window_pages(cache_root: Path) -> None:
    ratio, full, window = window_pages_ratio(cache_root)
    print(
        f"KV pages held per sequence at 4 x the window during decode (Gemma 3 text, 5 sliding "
        f": 1 full, window {PAGES_WINDOW} pages): full-attention layers {full}, sliding "
        f"layers {window} each; layer-weighted sliding / full attention = {ratio:.3f} "
        f"(floor 0.375, target <= 0.45)"
    )


def bench_families(demo_dir: Path, cache_root: Path, args) -> None:
    import transformers as tf

    if args.families_pages:
        bench_window_pages(cache_root)
        bench_gemma4_sharing(cache_root)
        return

    requests = make_requests(args.families_requests, 30000, 0, args.max_prompt, args.max_out)
    useful = sum(out_len for _, out_len in requests)
    batch = prompts(args.batch, 32, 0)
    new = 32
    print(
        f"throughput: {len(requests)} requests, prompts 16..{args.max_prompt}, outputs "
        f"8..{args.max_out} ({useful} output tokens), max batch {args.batch}; per step: "
        f"{len(batch)} x 32 prompt tokens, {new} new; float32, CPU, "
        f"{torch.get_num_threads()} thread(s); best of {args.repeats} alternating runs"
    )
    ratios = {}
    for arch in args.families.split(","):
        directory = family_model(arch, cache_root, demo_dir)
        config = EngineConfig(
            directory, max_num_seqs=args.batch, max_num_batched_tokens=512, num_pages=1024,
            device="cpu", dtype="float32",
        )  # fmt: skip
        engine = LLMEngine(config)
        hf = tf.AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32).eval()
        params = sum(p.numel() for p in hf.parameters())
        warm = prompts(2, 8, 1)
        engine_decode(engine, warm, 3)
        hf_decode(hf, warm, 3)
        best = {"engine": 0.0, "hf": 0.0, "engine step": 0.0, "hf step": 0.0}
        for _ in range(args.repeats):
            clear_prefix_cache(engine)
            best["engine"] = max(best["engine"], useful / run_engine(engine, requests))
            best["hf"] = max(best["hf"], useful / run_hf(hf, requests, args.batch, 0))
            seconds, tokens = engine_decode(engine, batch, new)
            best["engine step"] = max(best["engine step"], tokens / seconds)
            seconds, tokens = hf_decode(hf, batch, new)
            best["hf step"] = max(best["hf step"], tokens / seconds)
        ratios[arch] = best["engine"] / best["hf"]
        step_ratio = best["engine step"] / best["hf step"]
        print(
            f"{arch:12s} {params / 1e6:4.0f}M params  throughput engine {best['engine']:6.1f} "
            f"hf {best['hf']:6.1f} tok/s R {ratios[arch]:.2f}  |  per step engine "
            f"{best['engine step']:6.1f} hf {best['hf step']:6.1f} tok/s R {step_ratio:.2f}"
        )
        engine.close()
        del engine, hf
    print("ratio R (engine / HF decode throughput, target >= 1.5): " + ", ".join(
        f"{arch} {ratio:.2f}" for arch, ratio in ratios.items()
    ))  # fmt: skip
    bench_window_pages(cache_root)
    bench_gemma4_sharing(cache_root)
