"""The collector's view of a service's heap once it has started.

A service's startup leaves millions of long-lived objects behind (imported libraries, the
tokenizer's tables, the model's modules), and CPython's full collection walks every one of
them: 60-200 ms stalls of the event loop or the engine thread, measured in the gateway and
the LLM pod while they served (bench/hostile_grammar.py's tail). Frozen once the service is
up, those objects are out of the collector's reach, so a full collection walks only what
serving allocated. Nothing frozen is freed by the cycle collector again; reference counting
still frees it, and startup's objects live as long as the process anyway.
"""

from __future__ import annotations

import gc


def freeze_startup_heap() -> None:
    """Collect startup's garbage, then freeze every object still alive (call once, in a
    service's own process, when it is about to serve; not in tests that run a service
    inside the test process)."""
    gc.collect()
    gc.freeze()
