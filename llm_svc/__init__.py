"""llm_svc: the LLM pod — engine (llm_svc.engine), offline `LLM` (images encoded
in-process: `LLM(dir).generate(prompts, params, images=...)`), and the server.

`from llm_svc import LLM, SamplingParams` loads torch on first use only, so light modules
(the CLI) can import this package cheaply.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from llm_svc.engine import SamplingParams
    from llm_svc.llm import LLM, GenerateOutput

__all__ = ["LLM", "GenerateOutput", "SamplingParams"]


def __getattr__(name: str):
    if name in ("LLM", "GenerateOutput"):
        from llm_svc import llm

        return getattr(llm, name)
    if name == "SamplingParams":
        from llm_svc.engine.sampling_params import SamplingParams

        return SamplingParams
    raise AttributeError(f"module 'llm_svc' has no attribute {name!r}")
