"""`build_engine`, what a pod runs at start: its grammar compile workers start with it, or
(IRIS_LLM_GRAMMAR_WORKERS_AT_START=false) at its first structured request."""

from __future__ import annotations

from llm_svc.server.builder import build_engine
from llm_svc.settings import LLMSettings


def test_grammar_workers_start_with_the_pod_unless_it_is_told_to_wait(tiny_qwen2_vl_dir):
    lazy = build_engine(LLMSettings(model=str(tiny_qwen2_vl_dir), grammar_workers_at_start=False))
    try:
        assert lazy.grammars.ready_since is None  # no worker was started
    finally:
        lazy.close()
    eager = build_engine(LLMSettings(model=str(tiny_qwen2_vl_dir)))
    try:
        assert eager.grammars.ready_since is not None  # ready before the pod is
    finally:
        eager.close()
