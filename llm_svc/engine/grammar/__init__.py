"""Grammar-constrained decoding with xgrammar (docs/design/engine.md, "Grammar").

`Constraint` (kind + text) rides in SamplingParams; `GrammarCompilerPool` checks it and
compiles it off the engine thread, once per distinct constraint; `RequestGrammar` is one
request's compiled grammar and matcher; `StepConstraints` masks a step's logits (one
bitmask for every constrained row, on the logits' device) and adds logit_bias.
xgrammar is imported only when the first constraint arrives.
"""

from llm_svc.engine.grammar.compiler import GrammarCompilerPool, GrammarLimits
from llm_svc.engine.grammar.request import RequestGrammar
from llm_svc.engine.grammar.spec import Constraint, ConstraintKind
from llm_svc.engine.grammar.step import StepConstraints
from llm_svc.engine.grammar.waiting import CompilingRequests

__all__ = [
    "CompilingRequests",
    "Constraint",
    "ConstraintKind",
    "GrammarCompilerPool",
    "GrammarLimits",
    "RequestGrammar",
    "StepConstraints",
]
