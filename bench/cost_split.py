"""What an image costs on a model, measured here: the vision tower per tile and the language
model's prefill of one image's tokens. Every benchmark prints this line for the model it ran,
so that its ratios can be read against the split (reuse saves the tower; routing saves the
prefill).

    .venv/bin/python -m bench.cost_split [--model DIR]   # the demo model by default
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass
from pathlib import Path

CACHE_ROOT = Path(__file__).resolve().parents[1] / ".cache" / "models"
# The size an image is measured at: one tile on the demo model (its longest edge is capped
# at 512), a few tiles or a grid of patches on the tiny ones.
IMAGE_SIZE = (512, 512)


@dataclass(frozen=True)
class CostSplit:
    """Seconds: the tower for one image of IMAGE_SIZE and per tile; the LM's prefill of that
    image's tokens (on a cold prefix cache, as a request with that image pays it)."""

    tiles: int
    image_tokens: int
    tower_s: float
    prefill_s: float

    @property
    def tower_per_tile_s(self) -> float:
        return self.tower_s / self.tiles

    def line(self) -> str:
        return (
            f"cost split (measured, {IMAGE_SIZE[0]}x{IMAGE_SIZE[1]} image = {self.tiles} "
            f"tile(s), {self.image_tokens} tokens): tower {self.tower_per_tile_s * 1e3:.0f} ms "
            f"per tile ({self.tower_s * 1e3:.0f} ms an image), LM prefill "
            f"{self.prefill_s * 1e3:.0f} ms per image; tower / prefill "
            f"{self.tower_s / self.prefill_s:.1f}x"
        )


def demo_dir() -> Path:
    from iris.models.build import cached_demo

    return cached_demo(CACHE_ROOT)


def _tiles(prepared) -> int:
    """Tiles the tower ran on: Idefics3 stacks tiles as [tiles, 3, H, W]; patch-grid
    families (Qwen2-VL) count the image as one."""
    shape = getattr(prepared.pixel_values, "shape", ())
    return int(shape[0]) if len(shape) == 4 else 1


def _best(fn, repeats: int) -> float:
    fn()  # first-call costs (allocation, kernels chosen) are not the steady state
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def measure(model_dir: str | Path, repeats: int = 3, device: str = "cpu") -> CostSplit:
    """Best of `repeats` for the tower on one IMAGE_SIZE image and for the prefill of as
    many text tokens as that image has (the LM's work per token is the same), on one
    torch thread."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # one core, as each service runs by default (`iris up`)
    try:
        return _measure(model_dir, repeats, device)
    finally:
        torch.set_num_threads(threads)


def _measure(model_dir, repeats: int, device: str) -> CostSplit:
    import numpy as np
    import torch
    from PIL import Image

    from iris.models import load_adapter
    from llm_svc.engine import EngineConfig, LLMEngine, SamplingParams

    adapter = load_adapter(model_dir)
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    runner = adapter.vision_runner(device=device, dtype=dtype)
    pixels = np.random.default_rng(0).integers(0, 256, (*IMAGE_SIZE[::-1], 3), dtype=np.uint8)
    prepared = runner.preprocess(Image.fromarray(pixels))

    def tower() -> None:
        runner.encode([prepared])
        if device == "cuda":
            torch.cuda.synchronize()

    tower_s = _best(tower, repeats)
    tokens = prepared.token_count
    engine = LLMEngine(
        EngineConfig(
            model_dir,
            device=device,
            max_num_batched_tokens=max(512, tokens + 16),
            num_pages=4 * (tokens // 16 + 2),
        )
    )
    words = adapter.encode_prompt(" the quick brown fox jumps over a lazy dog" * tokens)
    counter = iter(range(1 << 30))

    def prefill() -> None:
        # Plain text (no image placeholder, whatever the vocabulary), led by a fresh number
        # so that the prefix cache serves none of it.
        count = next(counter)
        prompt = (adapter.encode_prompt(f"{count} ") + words)[:tokens]
        engine.add_request(f"p{count}", prompt, SamplingParams(max_tokens=1))
        while engine.has_unfinished():
            engine.step()

    prefill_s = _best(prefill, repeats)
    engine.close()
    return CostSplit(_tiles(prepared), tokens, tower_s, prefill_s)


def print_cost_split(model_dir: str | Path, label: str = "", device: str = "cpu") -> CostSplit:
    """Measure and print the split for `model_dir` (one line, prefixed by `label`)."""
    split = measure(model_dir, device=device)
    where = "1 CPU thread" if device == "cpu" else device
    print(f"{label + ': ' if label else ''}{split.line()} [{where}]", flush=True)
    return split


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=None, help="default: the demo model")
    args = parser.parse_args()
    model = args.model or demo_dir()
    print_cost_split(model, str(model))


if __name__ == "__main__":
    main()
