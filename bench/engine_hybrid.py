"""`bench/engine.py --only hybrid`: the prefix cache on a hybrid (Gated DeltaNet) model.

A random Qwen3_5ForCausalLM of the demo model's size (hidden 576, 24 layers: 18 linear,
6 full attention; built locally, nothing downloaded). With k fixed (`--hybrid-k` pages per
snapshot) it prints, measured side by side in one run:
- TTFT of a 1,024-token prompt cold (empty cache) against warm: a second prompt sharing the
  first's tokens up to the last snapshot boundary at or before token 1,008, then different;
- the hit depth the warm prompt reached (its cached tokens);
- snapshot bytes per cached page (one state slot / k) beside the KV bytes per page;
- cold TTFT with the prefix cache off (no chunk cut at snapshot boundaries), for the cost
  of cutting.
"""

from __future__ import annotations

import random
import time
from pathlib import Path

from llm_svc.engine import EngineConfig, LLMEngine, SamplingParams

SHAPE = dict(
    hidden_size=576, intermediate_size=1536, num_hidden_layers=24, num_attention_heads=9,
    num_key_value_heads=3, head_dim=64, linear_num_key_heads=4, linear_num_value_heads=8,
    linear_key_head_dim=64, linear_value_head_dim=64, linear_conv_kernel_dim=4,
    vocab_size=49152, max_position_embeddings=8192, tie_word_embeddings=True,
)  # fmt: skip


def hybrid_checkpoint(cache_root: Path) -> Path:
    """The random hybrid checkpoint under `cache_root`, built once."""
    from iris.models.build import build_atomically

    return build_atomically(cache_root / "hybrid-demo-size-v1", _build)


def _build(out: Path) -> None:
    import torch
    from transformers import Qwen3_5ForCausalLM, Qwen3_5TextConfig

    from iris.models.qwen3_5.tiny import CHAT_TEMPLATE, SPECIAL_TOKENS
    from iris.models.tokenizer_build import build_tokenizer, save_fast_tokenizer, tiny_vocab

    tokenizer = build_tokenizer(SPECIAL_TOKENS)
    ids, _ = tiny_vocab(tokenizer, SPECIAL_TOKENS)
    kinds = ["linear_attention"] * 3 + ["full_attention"]
    config = Qwen3_5TextConfig(
        **SHAPE, layer_types=kinds * (SHAPE["num_hidden_layers"] // 4),
        eos_token_id=ids["<|im_end|>"], pad_token_id=ids["<|endoftext|>"],
    )  # fmt: skip
    config.architectures = ["Qwen3_5ForCausalLM"]
    torch.manual_seed(0)
    Qwen3_5ForCausalLM(config).eval().save_pretrained(str(out), safe_serialization=True)
    save_fast_tokenizer(
        tokenizer, out, bos="<|endoftext|>", eos="<|im_end|>", pad="<|endoftext|>",
        chat_template=CHAT_TEMPLATE,
    )  # fmt: skip


def _ttft(engine: LLMEngine, request_id: str, prompt: list[int]) -> tuple[float, int]:
    engine.add_request(request_id, prompt, SamplingParams(temperature=0.0, max_tokens=1))
    start = time.perf_counter()
    while True:
        for out in engine.step():
            if out.new_token_ids:
                elapsed = time.perf_counter() - start
                while engine.has_unfinished():
                    engine.step()
                return elapsed, out.num_cached_tokens


def bench_hybrid(cache_root: Path, args) -> None:
    directory = hybrid_checkpoint(cache_root)
    k, page, length = args.hybrid_k, 16, args.ttft_prompt
    every = k * page
    shared = (length - 16) // every * every  # the last boundary at or before token 1,008
    print(f"hybrid model: random Qwen3_5ForCausalLM, {SHAPE['num_hidden_layers']} layers "
          f"(3 linear : 1 full), hidden {SHAPE['hidden_size']}\n  {directory}")  # fmt: skip
    print(f"k = {k} pages of {page} tokens (a snapshot every {every} tokens); "
          f"prompt {length} tokens, shared prefix {shared} tokens")  # fmt: skip
    rng = random.Random(7)
    prompt = [rng.randrange(100, 30000) for _ in range(length)]
    other = prompt[:shared] + [rng.randrange(100, 30000) for _ in range(length - shared)]
    common = dict(page_size=page, max_num_batched_tokens=512, max_num_seqs=8,
                  kv_cache_bytes=1 << 30, device=args.device)  # fmt: skip
    engine = LLMEngine(EngineConfig(directory, state_snapshot_interval=k, **common))
    plain = LLMEngine(EngineConfig(directory, enable_prefix_caching=False, **common))
    runner = engine.runner
    slot = runner._slot_bytes()
    print(f"device {engine.config.device}, dtype {engine.config.dtype}; KV pages "
          f"{runner.num_pages}, snapshot slots {runner.state_pool.snapshot_slots}")  # fmt: skip
    _ttft(engine, "warm-up", prompt[:64])
    _ttft(plain, "warm-up", prompt[:64])
    cold = warm = uncut = float("inf")
    depth = 0
    for repeat in range(args.repeats):
        engine.blocks.free_pages.extend(engine.blocks.cache.evict(engine.blocks.num_pages))
        cold = min(cold, _ttft(engine, f"cold{repeat}", prompt)[0])
        elapsed, depth = _ttft(engine, f"warm{repeat}", other)
        warm = min(warm, elapsed)
        uncut = min(uncut, _ttft(plain, f"uncut{repeat}", prompt)[0])
    print(f"TTFT {length}-token prompt: cold {cold * 1e3:.0f} ms, warm prefix {warm * 1e3:.0f} "
          f"ms, cold without prefix cache (chunks not cut) {uncut * 1e3:.0f} ms")  # fmt: skip
    print(f"hit depth reached: {depth} tokens of {shared} shared")
    print(f"snapshot: {slot / 2**20:.2f} MiB per slot, {slot / k / 2**10:.0f} KiB per cached "
          f"page, against {runner.kv_bytes_per_page() / 2**10:.0f} KiB of KV per page")  # fmt: skip
    print(f"ratio R {cold / warm:.2f}  TTFT cold / warm prefix, hybrid (target >= 10)")
    print(f"ratio R {cold / uncut:.2f}  TTFT cold with snapshot cuts / without")
    engine.close()
    plain.close()
