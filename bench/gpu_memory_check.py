"""Device check of the memory budget (issue 35) on a CUDA GPU: is the profiled step peak
the real one, and does the largest step fit beside the KV cache the budget sized while
the pod holds its whole embedding allowance?

    .venv/bin/python bench/gpu_memory_check.py [--model DIR] [--tokens 8192] [--seqs 256]
        [--utilisation 0.9] [--held-mib 1024]

Not yet run on a GPU (docs/design/engine.md, "Memory budget"). Default model: the tiny Qwen2-VL
test checkpoint (built locally, no network), a VLM, so the held-embedding term counts.

0. Loads the model alone and reads the allocator's peak during the load
   (`torch.cuda.max_memory_allocated`) against the loaded weights' bytes: each layer is
   built in its target dtype and allocated once (docs/design/engine.md, "Loading"), so the
   ratio should be 1.00 (FAIL above 1.15).
1. Loads the model, sizes the budget as the pod does (kv_sizing.kv_budget: the profiling
   step at `--tokens` batched tokens, all image rows, sampler at `--seqs` rows) and prints
   each part.
2. Allocates the KV cache it sized and `--held-mib` of held embeddings, then runs the same
   largest step again and reads the allocator's peak (net of the step's own KV cache and
   image-row stand-ins, as the budget counts it).
Prints `gpu memory check: load peak L MiB for W MiB of weights`, `step peak profiled X MiB,
rerun Y MiB`, `headroom H MiB` (what is left of utilisation × total after weights, KV,
held embeddings, memory outside torch and the rerun step) and PASS when the load peak is
within 1.15x the weights, H >= 0 and the profile is within 10% of the rerun; exits 1 on
FAIL.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from llm_svc.engine import EngineConfig  # noqa: E402
from llm_svc.engine.attention import KVCache  # noqa: E402
from llm_svc.engine.kv_sizing import kv_budget, profile_step  # noqa: E402
from llm_svc.engine.memory_budget import module_bytes  # noqa: E402
from llm_svc.engine.model_runner import ModelRunner  # noqa: E402
from llm_svc.engine.models import load_model  # noqa: E402

MIB = 1 << 20
LOAD_BOUND = 1.15


def load_peak(config: EngineConfig) -> tuple[int, int]:
    """(the allocator's peak above what was allocated before, the weights' bytes) while
    `config`'s model loads alone; the model is dropped afterwards."""
    device = torch.device("cuda")
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    model, _ = load_model(config.model_dir, config.torch_dtype, device)
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - before
    weights = module_bytes(model)
    del model
    torch.cuda.empty_cache()
    return peak, weights


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=None)
    parser.add_argument("--tokens", type=int, default=8192)
    parser.add_argument("--seqs", type=int, default=256)
    parser.add_argument("--utilisation", type=float, default=0.9)
    parser.add_argument("--held-mib", type=int, default=1024)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    if not torch.cuda.is_available():
        print("gpu memory check: no CUDA device here; run it on a GPU machine")
        return 2
    model = args.model
    if model is None:
        from tests.llm_svc.checkpoints import tiny_checkpoint

        model = tiny_checkpoint("qwen2_vl")
    config = EngineConfig(
        model, device="cuda", max_num_batched_tokens=args.tokens, max_num_seqs=args.seqs,
        gpu_memory_utilization=args.utilisation, max_held_embedding_bytes=args.held_mib * MIB,
    )  # fmt: skip
    device = torch.device("cuda")
    loaded_peak, weights = load_peak(config)
    load_ok = loaded_peak <= LOAD_BOUND * weights
    print(f"gpu memory check: load peak {loaded_peak / MIB:.0f} MiB for "
          f"{weights / MIB:.0f} MiB of weights ({loaded_peak / max(weights, 1):.2f}x, "
          f"bound {LOAD_BOUND}x)")  # fmt: skip
    # The runner with a one-page cache, which is then dropped: only the weights stay
    # allocated when the budget is measured, as in ModelRunner._num_pages.
    runner = ModelRunner(dataclasses.replace(config, num_pages=1))
    runner.kv_cache = runner.backend = None
    torch.cuda.empty_cache()
    start = time.perf_counter()
    budget = kv_budget(runner, config)
    profile_s = time.perf_counter() - start
    mc = runner.model_config
    per_page = KVCache.bytes_per_page(
        mc.num_layers, config.page_size, mc.num_kv_heads, mc.head_dim, config.torch_dtype
    )
    pages = budget.num_pages(per_page)
    print(f"budget: {budget.describe()}; {pages} pages of {per_page} bytes; "
          f"profile took {profile_s:.2f} s")  # fmt: skip

    kv = KVCache.allocate(mc.num_layers, pages, config.page_size, mc.num_kv_heads,
                          mc.head_dim, config.torch_dtype, device)  # fmt: skip
    held = torch.empty(budget.held_embeddings, dtype=torch.uint8, device=device)
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    step = profile_step(runner, config)
    torch.cuda.synchronize()
    # Net of the step's own KV cache and image-row stand-ins, as the budget counts it.
    rerun_peak = torch.cuda.max_memory_allocated() - before - step.counted_elsewhere
    free, total = torch.cuda.mem_get_info()
    used_peak = before + rerun_peak + budget.other
    headroom = budget.usable - used_peak
    close = abs(budget.step_peak - rerun_peak) <= 0.1 * max(rerun_peak, 1)
    ok = load_ok and headroom >= 0 and close
    kv_mib = 2 * kv.k.numel() * kv.k.element_size() / MIB
    print(f"gpu memory check: step peak profiled {budget.step_peak / MIB:.0f} MiB, "
          f"rerun {rerun_peak / MIB:.0f} MiB (beside {kv_mib:.0f} MiB KV and "
          f"{held.numel() / MIB:.0f} MiB held embeddings)")  # fmt: skip
    print(f"gpu memory check: headroom {headroom / MIB:.0f} MiB of utilisation x total "
          f"({budget.usable / MIB:.0f} MiB); device free now {free / MIB:.0f} of "
          f"{total / MIB:.0f} MiB")  # fmt: skip
    print(f"gpu memory check: {'PASS' if ok else 'FAIL'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
