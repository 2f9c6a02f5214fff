"""Tensor parallelism: TP 2 against TP 1 decode throughput on a demo-sized language model
with even heads (SmolLM2-135M's shape, 8 heads and 4 KV heads instead of 9 and 3, random
weights, the demo's tokenizer), measured side by side in one process, with the per-step
cost of rank 0's broadcast and of the all-reduces printed beside it.

    python bench/engine.py --only tp [--device cuda] [--tp-requests N] [--tp-out N]

On the CPU every rank gets one torch thread (as the pod runs them), so TP 1 uses one core
and TP 2 two; on a 2-core machine shared with other work no gain is expected: the figures
are there so the overhead is known. On CUDA, TP 2 needs two devices.
"""

from __future__ import annotations

import time
from pathlib import Path

import torch

from llm_svc.engine import EngineConfig, LLMEngine, SamplingParams

SHAPE = dict(
    hidden_size=576,
    intermediate_size=1536,
    num_hidden_layers=30,
    num_attention_heads=8,
    num_key_value_heads=4,
    max_position_embeddings=2048,
    rms_norm_eps=1e-5,
    tie_word_embeddings=True,
)
VERSION = "v1"


def even_heads_model(cache_root: Path, tokenizer_dir: Path) -> Path:
    """Build (once) the demo-sized Llama with even heads, the demo tokenizer's vocabulary."""
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    from iris.models.build import build_atomically

    out = cache_root / f"bench-tp-even-heads-{VERSION}"
    if (out / "config.json").is_file():
        return out
    tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_dir))

    def build(directory: Path) -> None:
        torch.manual_seed(0)
        config = LlamaConfig(vocab_size=len(tokenizer), **SHAPE)
        LlamaForCausalLM(config).save_pretrained(directory)
        tokenizer.save_pretrained(directory)

    return build_atomically(out, build)


class Timings:
    """Wall time and calls of rank 0's broadcasts and all-reduces (the latter include
    waiting for the slowest rank: that wait is the step's cost of splitting it)."""

    def __init__(self) -> None:
        self.seconds = {"broadcast": 0.0, "all-reduce": 0.0, "gather": 0.0}
        self.calls = {"broadcast": 0, "all-reduce": 0, "gather": 0}

    def wrap(self, name: str, function):
        def timed(*args, **kwargs):
            start = time.perf_counter()
            result = function(*args, **kwargs)
            device = result.device if isinstance(result, torch.Tensor) else None
            if device is not None and device.type == "cuda":
                torch.cuda.synchronize(device)
            self.seconds[name] += time.perf_counter() - start
            self.calls[name] += 1
            return result

        return timed


def _run(engine: LLMEngine, requests) -> tuple[float, int]:
    for index, (prompt, out_len) in enumerate(requests):
        params = SamplingParams(temperature=0.0, max_tokens=out_len, ignore_eos=True)
        engine.add_request(f"r{index}", prompt, params)
    steps, start = 0, time.perf_counter()
    while engine.has_unfinished():
        engine.step()
        steps += 1
    return time.perf_counter() - start, steps


def bench_tp(demo_dir: Path, cache_root: Path, args) -> None:
    import random

    directory = even_heads_model(cache_root, demo_dir)
    rng = random.Random(0)
    prompts = [[rng.randrange(100, 30000) for _ in range(16)] for _ in range(args.tp_requests)]
    requests = [(prompt, args.tp_out) for prompt in prompts]
    useful = sum(out for _, out in requests)
    if args.device == "cuda" and torch.cuda.device_count() < 2:
        print(f"TP 2 on CUDA needs two devices; {torch.cuda.device_count()} visible: skipped")
        return
    results = {}
    for size in (1, 2):
        config = EngineConfig(
            directory, max_num_seqs=args.tp_requests, max_num_batched_tokens=512,
            num_pages=512, device=args.device, tensor_parallel_size=size,
            enable_prefix_caching=False,
        )  # fmt: skip
        engine = LLMEngine(config)
        _run(engine, [(prompts[0], 4)])  # warm-up
        timings = Timings()
        if size > 1:
            runner = engine.runner
            runner.group.all_reduce = timings.wrap("all-reduce", runner.group.all_reduce)
            runner.channel.send = timings.wrap("broadcast", runner.channel.send)
            runner.group.gather_columns = timings.wrap("gather", runner.group.gather_columns)
        best, steps = float("inf"), 0
        for _ in range(args.repeats):
            seconds, steps = _run(engine, requests)
            best = min(best, seconds)
        runs = args.repeats
        results[size] = (best, steps, timings, runs)
        print(f"TP {size}: {useful / best:8.1f} tok/s decode-heavy ({best:.2f} s, {steps} steps, "
              f"{config.device}, {torch.get_num_threads()} thread(s) on rank 0)")  # fmt: skip
        engine.close()
    _, steps, timings, runs = results[2]
    per_step = {name: timings.seconds[name] / (steps * runs) for name in timings.seconds}
    calls = {name: timings.calls[name] / (steps * runs) for name in timings.calls}
    step = results[2][0] / steps
    print(f"TP 2 per step ({step * 1000:.2f} ms): broadcast {per_step['broadcast'] * 1000:.3f} ms "
          f"({calls['broadcast']:.0f} call), all-reduce {per_step['all-reduce'] * 1000:.3f} ms "
          f"({calls['all-reduce']:.0f} calls; embedding + 2 per layer), logits gather "
          f"{per_step['gather'] * 1000:.3f} ms")  # fmt: skip
    print(f"ratio R {results[1][0] / results[2][0]:.2f}  TP 2 / TP 1 decode output tokens per "
          f"second ({args.tp_requests} requests x {args.tp_out} tokens)")  # fmt: skip
