"""Speculative decoding: proposers of draft tokens (n-gram prompt lookup; Qwen3.5's MTP
layer; an oracle for tests and the bench), their exact verification by the target model,
and the rules for who drafts (docs/design/engine.md, "Speculative decoding")."""

from __future__ import annotations

from llm_svc.engine.config import EngineConfig
from llm_svc.engine.spec.mtp_proposer import MTPProposer
from llm_svc.engine.spec.ngram import NgramProposer
from llm_svc.engine.spec.oracle import OracleProposer
from llm_svc.engine.spec.proposer import Proposer
from llm_svc.engine.spec.speculator import SpecState, SpecStats, Speculator
from llm_svc.engine.spec.verify import Verdict, Verification, rejection_sample, verify


def make_speculator(config: EngineConfig, vocab_size: int, runner=None) -> Speculator | None:
    """The engine's speculator, or None when `num_speculative_tokens` is 0; "mtp" loads
    the checkpoint's MTP layer beside `runner`'s model (a ModelRunner: TP 1)."""
    if not config.num_speculative_tokens:
        return None
    if config.speculative_method == "mtp":
        proposer = _mtp_proposer(config, runner)
    else:
        proposer = NgramProposer(vocab_size)
    return Speculator(
        proposer,
        config.num_speculative_tokens,
        config.speculative_min_acceptance,
        config.speculative_max_batch,
    )


def _mtp_proposer(config: EngineConfig, runner) -> MTPProposer:
    from llm_svc.engine.models.qwen3_5 import Qwen3_5LM
    from llm_svc.engine.spec.mtp import load_mtp, mtp_layer_count

    if not isinstance(runner.model, Qwen3_5LM) or not mtp_layer_count(config.model_dir):
        raise ValueError(
            f"speculative_method 'mtp' needs a Qwen3.5 or Qwen3.5-MoE checkpoint with mtp.* "
            f"weights; {config.model_dir} ({runner.model_config.architecture}) has none: "
            f"use speculative_method 'ngram'"
        )
    layer = load_mtp(config.model_dir, runner.model_config, config.torch_dtype, runner.device)
    runner.keep_hidden = True
    return MTPProposer(layer, runner.model)


__all__ = [
    "MTPProposer",
    "NgramProposer",
    "OracleProposer",
    "Proposer",
    "SpecState",
    "SpecStats",
    "Speculator",
    "Verdict",
    "Verification",
    "make_speculator",
    "rejection_sample",
    "verify",
]
