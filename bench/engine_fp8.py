"""FP8 against bf16 in the engine (`python bench/engine.py --only fp8 [--device cuda]`).

The bench model is quantized here to the two FP8 layouts (per-channel compressed-tensors
with dynamic activations: W8A8 on `torch._scaled_mm` where the device runs it; 128x128
block-wise: weight-only, dequantized in each layer call) and each variant is run side by
side with the bf16 model in the same process, all in bf16 compute: decode throughput (the
steps after every prompt is prefilled) and the bytes the weights take. On the CPU no gain
is expected from the weight-only path: it dequantizes each weight in every call.
"""

from __future__ import annotations

import time
from pathlib import Path

import torch

from llm_svc.engine import EngineConfig, LLMEngine, SamplingParams
from llm_svc.engine.models.quantization import Fp8Linear, Fp8ScaledLinear

VARIANTS = (("bf16", None), ("fp8 per-channel", "channel"), ("fp8 block 128x128", "block"))


def decode_throughput(engine: LLMEngine, batch: int, prompt_len: int, out_len: int) -> float:
    """Output tokens per second over the decode steps of `batch` greedy requests."""
    vocab = engine.model_config.vocab_size
    for index in range(batch):
        prompt = [(100 + 7 * index + 3 * i) % vocab for i in range(prompt_len)]
        params = SamplingParams(temperature=0.0, max_tokens=out_len, ignore_eos=True)
        engine.add_request(f"fp8-{time.monotonic_ns()}-{index}", prompt, params)
    started: set[str] = set()
    while len(started) < batch:  # prefill: every request has its first token
        started.update(out.request_id for out in engine.step() if out.new_token_ids)
    tokens, start = 0, time.perf_counter()
    while engine.has_unfinished():
        tokens += sum(len(out.new_token_ids) for out in engine.step())
    return tokens / (time.perf_counter() - start)


def weight_bytes(engine: LLMEngine) -> int:
    model = engine.runner.model
    return sum(p.numel() * p.element_size() for p in model.parameters())


def layer_kinds(engine: LLMEngine) -> str:
    """How many FP8 layers of each kind, and their bytes against the same layers in bf16."""
    fp8 = [m for m in engine.runner.model.modules() if isinstance(m, Fp8Linear)]
    if not fp8:
        return ""
    scaled = sum(isinstance(m, Fp8ScaledLinear) for m in fp8)
    size = sum(p.numel() * p.element_size() for m in fp8 for p in m.parameters())
    as_bf16 = sum(m.weight.numel() * 2 for m in fp8)
    return (
        f"{scaled} W8A8 + {len(fp8) - scaled} weight-only FP8 layers "
        f"(x{size / as_bf16:.2f} of their bf16 bytes)"
    )


def bench_fp8(directory: Path, args) -> None:
    from tests.llm_svc.fp8_checkpoints import quantize

    directories = {
        name: directory if layout is None else quantize(directory, layout)
        for name, layout in VARIANTS
    }
    engines = {
        name: LLMEngine(
            EngineConfig(
                path,
                max_num_seqs=args.fp8_batch,
                max_num_batched_tokens=512,
                kv_cache_bytes=1 << 30,
                device=args.device,
                dtype="bfloat16",
            )
        )  # fmt: skip
        for name, path in directories.items()
    }
    device = engines["bf16"].config.device
    print(f"fp8 on {device}, bf16 compute, batch {args.fp8_batch}, prompts {args.fp8_prompt} "
          f"tokens, {args.fp8_out} decoded each, best of {args.repeats}")  # fmt: skip
    for engine in engines.values():
        decode_throughput(engine, 2, 8, 4)  # warm-up
    best = dict.fromkeys(engines, 0.0)
    # Alternate the variants and keep each one's best: a busy spell slows all alike.
    for _ in range(args.repeats):
        for name, engine in engines.items():
            rate = decode_throughput(engine, args.fp8_batch, args.fp8_prompt, args.fp8_out)
            best[name] = max(best[name], rate)
    base_bytes = weight_bytes(engines["bf16"])
    for name, engine in engines.items():
        size = weight_bytes(engine)
        print(f"{name:18s} decode {best[name]:8.1f} tok/s  x{best[name] / best['bf16']:.2f}   "
              f"weights {size / 2**20:7.1f} MiB  x{size / base_bytes:.2f}  "
              f"{layer_kinds(engine)}")  # fmt: skip
    if torch.cuda.is_available():
        print(f"peak CUDA memory: {torch.cuda.max_memory_allocated() / 2**20:.0f} MiB")
