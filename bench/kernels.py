"""Kernel benchmark: embedding scatter and tensor checksum, as ratios measured side by side.

    .venv/bin/python bench/kernels.py                 # CUDA if present, else the CPU twins
    .venv/bin/python bench/kernels.py --rows 1024,4096 --hidden 4096 --checksum-mb 8,64

By default on the demo model's sizes (rows of its LM hidden size), whose measured cost split
(tower per tile, LM prefill per image) it prints first.

Scatter: M rows × hidden bf16 go to M distinct rows of a dest with 25 % more rows (text
rows between images). Reported: payload GB/s (M·hidden·2 bytes / time) of `scatter_rows`
with host-computed rows, and its ratio to a plain device copy of the same bytes, to torch
`index_copy_` and to torch `masked_scatter_` (what a mask-based assembly would do). Targets on an
H200-class GPU: scatter ≥ 0.85× copy and ≥ 1.0× torch. Checksum: GB/s of
`iris_kernels.checksum` and its ratio to a plain copy of the same bytes (and BLAKE3 on a CPU).
On a CPU the Triton kernels cannot run compiled, so the twins are measured and it says so.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import iris_kernels  # noqa: E402


def timed(fn: Callable[[], object], device: torch.device, repeats: int) -> float:
    """Median seconds of one call, after a warm-up call."""

    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    fn()
    sync()
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        sync()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def bench_scatter(rows: int, hidden: int, device: torch.device, repeats: int) -> None:
    total = rows + rows // 4
    dest = torch.zeros(total, hidden, dtype=torch.bfloat16, device=device)
    src = torch.randn(rows, hidden, device=device).to(torch.bfloat16)
    host_rows = torch.randperm(total)[:rows].sort().values
    device_rows = host_rows.to(device)
    mask = torch.zeros(total, dtype=torch.bool)
    mask[host_rows] = True
    wide_mask = mask.to(device).unsqueeze(1)
    copy_dest = torch.empty_like(src)
    payload = src.numel() * src.element_size()

    results = {
        "copy": timed(lambda: copy_dest.copy_(src), device, repeats),
        "scatter_rows": timed(
            lambda: iris_kernels.scatter_rows(dest, src, host_rows), device, repeats
        ),
        "torch index_copy_": timed(lambda: dest.index_copy_(0, device_rows, src), device, repeats),
        "torch masked_scatter_": timed(
            lambda: dest.masked_scatter_(wide_mask, src), device, repeats
        ),
    }
    print(f"\nscatter {rows} rows x {hidden} bf16 ({payload / 2**20:.0f} MiB payload)")
    for name, seconds in results.items():
        print(f"  {name:24s} {payload / seconds / 1e9:8.1f} GB/s  {seconds * 1e3:8.3f} ms")
    ours = results["scatter_rows"]
    target = "  (target >= 0.85 on an H200)" if device.type == "cuda" else ""
    print(f"  scatter_rows / copy                 {results['copy'] / ours:5.2f}x{target}")
    print(f"  scatter_rows vs index_copy_         {results['torch index_copy_'] / ours:5.2f}x")
    print(f"  scatter_rows vs masked_scatter_     {results['torch masked_scatter_'] / ours:5.2f}x")


def bench_checksum(megabytes: int, device: torch.device, repeats: int) -> None:
    data = torch.randn(megabytes * 2**20 // 2, device=device).to(torch.bfloat16)
    size = data.numel() * data.element_size()
    copy_dest = torch.empty_like(data)
    results = {
        "copy": timed(lambda: copy_dest.copy_(data), device, repeats),
        "checksum": timed(lambda: iris_kernels.checksum(data), device, repeats),
    }
    if device.type == "cuda":
        results["checksum (torch twin)"] = timed(
            lambda: iris_kernels.checksum(data, backend="torch"), device, repeats
        )
    else:
        import blake3

        raw = data.view(torch.uint8).numpy()
        results["blake3 (1 thread)"] = timed(lambda: blake3.blake3(raw).digest(), device, repeats)
    print(f"\nchecksum of {megabytes} MiB")
    for name, seconds in results.items():
        print(f"  {name:24s} {size / seconds / 1e9:8.2f} GB/s  {seconds * 1e3:8.3f} ms")
    print(f"  checksum / copy                     {results['copy'] / results['checksum']:5.2f}x")
    if "blake3 (1 thread)" in results:
        ratio = results["blake3 (1 thread)"] / results["checksum"]
        print(f"  checksum vs blake3                  {ratio:5.2f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", default=None, help="comma list (CUDA 8192,16384,65536)")
    parser.add_argument(
        "--hidden", type=int, default=None, help="default: the demo model's LM hidden size"
    )
    parser.add_argument("--checksum-mb", default=None, help="comma list (CUDA 8,64,512)")
    parser.add_argument("--repeats", type=int, default=None)
    args = parser.parse_args()

    cuda = torch.cuda.is_available()
    device = torch.device("cuda" if cuda else "cpu")
    from bench.cost_split import demo_dir, print_cost_split

    model = demo_dir()
    split = print_cost_split(model, "demo model", device=device.type)
    if args.hidden is None:
        config = json.loads((model / "config.json").read_text())
        args.hidden = config["text_config"]["hidden_size"]
    print(f"rows of {args.hidden} (the demo LM's hidden size); an image is "
          f"{split.image_tokens} rows")  # fmt: skip
    rows = args.rows or ("8192,16384,65536" if cuda else "1024,4096")
    sizes = args.checksum_mb or ("8,64,512" if cuda else "8,64")
    repeats = args.repeats or (50 if cuda else 5)
    if cuda:
        print(f"device: {torch.cuda.get_device_name(device)} — Triton kernels, compiled")
    else:
        print(
            f"device: CPU ({torch.get_num_threads()} threads) — no CUDA device, so this measures "
            "the torch twins, not the Triton kernels"
        )
    for count in (int(v) for v in rows.split(",")):
        bench_scatter(count, args.hidden, device, repeats)
    for megabytes in (int(v) for v in sizes.split(",")):
        bench_checksum(megabytes, device, repeats)
    print("\nlaunches:", dict(iris_kernels.CALLS))


if __name__ == "__main__":
    main()
