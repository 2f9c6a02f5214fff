"""Child process of tests/llm_svc/test_load_memory.py: load a checkpoint while the parent
samples this process's anonymous memory.

    python tests/llm_svc/load_child.py MODEL_DIR WARMUP_DIR DTYPE

Loads WARMUP_DIR first (imports and one-time setup of the load path, such as torch's meta
registrations, cost tens of MB and are not the loader's), prints `ready`, waits for a line
on stdin, loads MODEL_DIR, prints the loaded parameters' bytes, and waits for a last line
so the parent can read its memory once more.
"""

from __future__ import annotations

import sys

import torch

from llm_svc.engine.memory_budget import module_bytes
from llm_svc.engine.models import load_model


def main() -> None:
    model_dir, warmup_dir, dtype = sys.argv[1], sys.argv[2], getattr(torch, sys.argv[3])
    cpu = torch.device("cpu")
    load_model(warmup_dir, dtype, cpu)
    print("ready", flush=True)
    sys.stdin.readline()
    model, _ = load_model(model_dir, dtype, cpu)
    print(module_bytes(model), flush=True)
    sys.stdin.readline()


if __name__ == "__main__":
    main()
