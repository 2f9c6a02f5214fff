"""FP8 experts: a tiny Qwen3-MoE quantized block-wise (128x128 `weight_scale_inv`, per
expert, as the published Qwen3 FP8 checkpoints ship them) loads with its experts kept in FP8
and generates what its dequantized float32 checkpoint generates; FP8 under tensor
parallelism stays refused."""

from __future__ import annotations

import pytest
import torch

from iris.models.build import build_atomically
from llm_svc.engine.models.moe import Experts
from llm_svc.engine.models.quantization import Fp8Experts
from llm_svc.engine.parallel.checks import check_tensor_parallel
from tests.llm_svc.checkpoints import CACHE_ROOT
from tests.llm_svc.conftest import greedy, make_engine, run_all
from tests.llm_svc.fp8_checkpoints import FP8, dequantized, quantize

PROMPTS = ["The quick brown fox jumps over", "A cat sat on the mat and then"]
NEW_TOKENS = 8
LOGPROB_TOLERANCE = 1e-4  # issue 45's tolerance against the reference


def odd_qwen3_moe():
    """A tiny Qwen3-MoE whose experts are 160 wide and 144 deep: each expert's gate, up and
    down span 2x2 blocks of 128, the last ones partial."""
    from iris.models.text_tiny import build

    return build_atomically(
        CACHE_ROOT / "odd-qwen3-moe-v1",
        lambda out: build(
            "qwen3_moe", out, num_hidden_layers=2, hidden_size=160, moe_intermediate_size=144
        ),
    )


@pytest.fixture(scope="module")
def fp8_moe():
    return quantize(odd_qwen3_moe(), "block")


def _generate(engine):
    requests = {
        str(i): (engine.tokenizer(text)["input_ids"], greedy(NEW_TOKENS, logprobs=1))
        for i, text in enumerate(PROMPTS)
    }
    outputs = run_all(engine, requests)
    return [
        (
            [t for out in outputs[str(i)] for t in out.new_token_ids],
            [lp.top[0][1] for out in outputs[str(i)] for lp in out.new_logprobs],
        )
        for i in range(len(PROMPTS))
    ]


def test_fp8_experts_stay_fp8_and_match_the_dequantized_model(fp8_moe):
    engine = make_engine(fp8_moe, dtype="float32")
    blocks = [m for m in engine.runner.model.modules() if isinstance(m, Experts)]
    assert blocks and all(isinstance(m, Fp8Experts) for m in blocks)
    for block in blocks:
        assert block.gate_up_proj.dtype == block.down_proj.dtype == FP8
        assert tuple(block.gate_up_proj_scale_inv.shape[1:]) == (4, 2)  # gate 2x2, up 2x2
    got = _generate(engine)
    engine.close()
    reference = make_engine(dequantized(fp8_moe), dtype="float32")
    assert not any(isinstance(m, Fp8Experts) for m in reference.runner.model.modules())
    expected = _generate(reference)
    reference.close()
    for (tokens, logprobs), (want_tokens, want_logprobs) in zip(got, expected, strict=True):
        assert tokens == want_tokens
        assert len(tokens) == NEW_TOKENS
        torch.testing.assert_close(
            torch.tensor(logprobs), torch.tensor(want_logprobs), rtol=0, atol=LOGPROB_TOLERANCE
        )


def test_fp8_expert_dequantizes_each_block_by_its_own_scale(fp8_moe):
    """One expert's weights, dequantized by the engine, equal the reference checkpoint's."""
    from safetensors import safe_open

    engine = make_engine(fp8_moe, dtype="float32")
    block = next(m for m in engine.runner.model.modules() if isinstance(m, Fp8Experts))
    gate_up, down = block.expert_weights(3, torch.float32)
    engine.close()
    reference = dequantized(fp8_moe) / "model.safetensors"
    with safe_open(str(reference), framework="pt") as handle:
        base = "model.layers.0.mlp.experts.3."
        gate, up = (handle.get_tensor(base + p + ".weight") for p in ("gate_proj", "up_proj"))
        assert torch.equal(gate_up, torch.cat([gate, up]))
        assert torch.equal(down, handle.get_tensor(base + "down_proj.weight"))


def test_fp8_experts_under_tensor_parallelism_are_refused(fp8_moe):
    with pytest.raises(ValueError, match=r"tensor_parallel_size 2 with a quantized checkpoint"):
        check_tensor_parallel(fp8_moe, 2, "cpu")
