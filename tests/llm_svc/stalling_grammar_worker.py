"""A compile worker for tests (EngineConfig.grammar_worker_module): a constraint whose text
starts with STALL never finishes compiling (it waits forever, whatever the machine's
speed), so the pool's timeout must kill its worker; anything else compiles as usual."""

from __future__ import annotations

import threading

from llm_svc.engine.grammar import worker
from llm_svc.engine.grammar.build import compile_constraint

STALL = "(stall)"


def _compile(compiler, kind, value):
    if value.startswith(STALL):
        threading.Event().wait()
    return compile_constraint(compiler, kind, value)


def serve(conn) -> None:
    worker.serve(conn, _compile)
