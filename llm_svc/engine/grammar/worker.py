"""A compile worker process's loop, forked from a server that has xgrammar imported.

Protocol over a multiprocessing Pipe: the pool sends xgrammar's serialised TokenizerInfo;
the worker answers {"ready": True}; then, per job, the pool sends (kind, value) and the
worker answers {"compiled": CompiledGrammar.serialize_json()} or {"error": the first line
of xgrammar's message}. The pool kills a worker whose compile outlives the timeout
(llm_svc/engine/grammar/workers.py)."""

from __future__ import annotations

from collections.abc import Callable

import xgrammar  # noqa: F401 - imported once by the fork server, so workers start warm

from llm_svc.engine.grammar.build import compile_constraint
from llm_svc.engine.grammar.spec import ConstraintKind


def serve(conn, compile_fn: Callable = compile_constraint) -> None:
    """Answer jobs until the pipe closes. `compile_fn(compiler, kind, value)`."""
    info = xgrammar.TokenizerInfo.deserialize_json(conn.recv())
    compiler = xgrammar.GrammarCompiler(info, max_threads=1, cache_enabled=False)
    conn.send({"ready": True})
    while True:
        try:
            kind, value = conn.recv()
        except EOFError:
            return
        try:
            compiled = compile_fn(compiler, ConstraintKind(kind), value)
            reply = {"compiled": compiled.serialize_json()}
        except Exception as err:  # xgrammar's RuntimeError / InvalidJSONError / ValueError
            text = str(err).strip()
            reply = {"error": text.splitlines()[0] if text else type(err).__name__}
        conn.send(reply)
