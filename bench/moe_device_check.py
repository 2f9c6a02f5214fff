"""Device check of the fused MoE (iris_kernels/grouped_gemm.py through Experts.forward_fused)
against the grouped path (one host-looped matmul pair per expert) on a CUDA GPU.

The fused path is tested on the CPU under TRITON_INTERPRET=1 (tests/kernels/
test_grouped_gemm.py, tests/kernels/test_fused_moe.py); compiled on a GPU it has NOT yet
run (docs/status.md). This script is what would show it does:

1. parity: for Qwen3-30B-A3B-shaped experts (E=128, H=2048, I=768, top-8) in bf16, at
   several token counts, the fused output equals the grouped one within bf16 rounding
   (TOLERANCE of the output's largest magnitude);
2. speed: the median time of each path over REPEATS runs and the ratio grouped / fused
   (`ratio R`, > 1 means the fused path is faster).

Run: `python bench/moe_device_check.py` (exit status 0 = parity held at every size).
`--device cpu` runs the same with small shapes under the Triton interpreter (how this script
itself was tried; its times mean nothing).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

TOLERANCE = 2e-2
REPEATS = 20


def _build(device: str, dtype, experts: int, hidden: int, inter: int, top_k: int):
    import torch

    from llm_svc.engine.models.config import MoeConfig
    from llm_svc.engine.models.moe import SparseMoE

    config = MoeConfig(
        num_experts=experts, top_k=top_k, intermediate_size=inter, norm_topk_prob=True
    )
    block = SparseMoE(hidden, config)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for param in block.parameters():
            param.copy_(torch.randn(param.shape, generator=generator) * hidden**-0.5)
    return block.to(device=device, dtype=dtype)


def _timed(fn, device: str) -> float:
    import torch

    times = []
    for _ in range(REPEATS if device == "cuda" else 2):
        if device == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        fn()
        if device == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    args = parser.parse_args()
    if args.device == "cpu":
        os.environ["TRITON_INTERPRET"] = "1"
        shape, sizes, dtype_name = (8, 64, 32, 2), (1, 5, 40), "float32"
    else:
        shape, sizes, dtype_name = (128, 2048, 768, 8), (1, 16, 256, 2048), "bfloat16"
    import torch

    dtype = getattr(torch, dtype_name)
    block = _build(args.device, dtype, *shape)
    experts = block.experts
    ok = True
    print(f"experts E={shape[0]} H={shape[1]} I={shape[2]} top-{shape[3]} {dtype_name}")
    for tokens in sizes:
        x = torch.randn(tokens, shape[1], device=args.device, dtype=dtype)
        with torch.no_grad():
            weights, chosen = block.gate(x)
            experts.fused = False
            grouped = experts(x, weights, chosen)
            experts.fused = True
            fused = experts(x, weights, chosen)
            error = (fused.float() - grouped.float()).abs().max().item()
            scale = grouped.float().abs().max().item() or 1.0
            passed = error <= TOLERANCE * scale
            ok &= passed
            experts.fused = False
            t_grouped = _timed(lambda: experts(x, weights, chosen), args.device)  # noqa: B023
            experts.fused = True
            t_fused = _timed(lambda: experts(x, weights, chosen), args.device)  # noqa: B023
        print(
            f"tokens {tokens:5d}: max |fused - grouped| {error:.3e} of {scale:.3e} "
            f"{'ok' if passed else 'FAIL'}; grouped {t_grouped * 1e3:.3f} ms, "
            f"fused {t_fused * 1e3:.3f} ms, ratio {t_grouped / t_fused:.2f}"
        )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
