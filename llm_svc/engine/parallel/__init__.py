"""Tensor parallelism inside one LLM pod (docs/design/parallelism.md).

Rank 0 is the engine's process: it keeps the scheduler, the radix cache, the embedding
fetch and the gRPC server, and drives the other ranks (spawned processes, one per device)
through one broadcast per step. `make_runner(config)` is the engine's runner for either
size.
"""

from __future__ import annotations


def make_runner(config):
    """A ModelRunner for size 1; rank 0's DriverRunner (which starts the others) above."""
    if config.tensor_parallel_size == 1:
        from llm_svc.engine.model_runner import ModelRunner

        return ModelRunner(config)
    from llm_svc.engine.parallel.runner import DriverRunner

    return DriverRunner(config)
