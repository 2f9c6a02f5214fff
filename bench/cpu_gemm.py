"""The weight layout the CPU engine uses for float32 GEMMs (llm_svc/engine/models/cpu_layout.py).

For each projection shape of the demo model's language model (SmolLM2-135M: hidden 576, 9
query and 3 KV heads of 64, MLP 1536, vocabulary 49,152 for the tied LM head), and a range
of row counts M (a decode step's batch, up to a prefill chunk), times `F.linear(x, w)` with
w [N, K] stored row-major (nn.Linear's layout, HF's) and column-major (the engine's on the
CPU), alternating the two and keeping each one's best, in one process. Prints row-major
time / column-major time: above 1, the engine's layout is faster.

    python bench/cpu_gemm.py [--torch-threads 1] [--repeats 5]
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.nn.functional as F

SHAPES = {  # name: (K, N)
    "q_proj, o_proj": (576, 576),
    "k_proj, v_proj": (576, 192),
    "gate_proj, up_proj": (576, 1536),
    "down_proj": (1536, 576),
    "lm_head (tied)": (576, 49152),
}
ROWS = (1, 2, 3, 4, 8, 13, 16, 32, 64, 128, 512)


def seconds_per_call(x: torch.Tensor, weight: torch.Tensor, calls: int) -> float:
    start = time.perf_counter()
    for _ in range(calls):
        F.linear(x, weight)
    return (time.perf_counter() - start) / calls


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--torch-threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=5, help="alternating rounds, best kept")
    args = parser.parse_args()
    torch.set_num_threads(args.torch_threads)
    torch.manual_seed(0)
    print(f"float32, {torch.get_num_threads()} thread(s); row-major / column-major time, by M")
    print(f"{'shape':20s} " + " ".join(f"{m:>6d}" for m in ROWS))
    for name, (k, n) in SHAPES.items():
        rows_major = torch.randn(n, k)
        columns = rows_major.t().contiguous().t()  # same values, strides (1, N)
        ratios = []
        for m in ROWS:
            x = torch.randn(m, k)
            calls = max(1, int(2e6 // (m * k * n // 1000 + 1)))
            # The same product, up to the summation order of two kernels.
            torch.testing.assert_close(F.linear(x, rows_major), F.linear(x, columns),
                                       rtol=1e-4, atol=1e-4)  # fmt: skip
            row = column = float("inf")
            for _ in range(args.repeats):
                row = min(row, seconds_per_call(x, rows_major, calls))
                column = min(column, seconds_per_call(x, columns, calls))
            ratios.append(row / column)
        print(f"{name:20s} " + " ".join(f"{r:6.2f}" for r in ratios))


if __name__ == "__main__":
    main()
