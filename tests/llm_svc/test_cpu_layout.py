"""The CPU's float32 weight layout (llm_svc/engine/models/cpu_layout.py): every GEMM weight
is column-major after loading, holds the checkpoint's values, and nothing else moves; bf16
keeps nn.Linear's row-major layout. (That the engine's output is unchanged is what every
parity suite checks: they all run on the CPU in float32.)"""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file
from torch import nn

from llm_svc.engine.models import find_text_prefix, load_model
from llm_svc.engine.models.moe import Experts
from tests.llm_svc.checkpoints import tiny_checkpoint
from tests.llm_svc.family_checkpoints import family_checkpoint

CPU = torch.device("cpu")


def checkpoint_tensors(model_dir) -> dict[str, torch.Tensor]:
    tensors = {}
    for path in sorted(model_dir.glob("*.safetensors")):
        tensors.update(load_file(path))
    prefix = find_text_prefix(list(tensors))
    found = {name[len(prefix) :]: t for name, t in tensors.items() if name.startswith(prefix)}
    if "lm_head.weight" in tensors:  # a plain LM keeps it beside the prefix
        found["lm_head.weight"] = tensors["lm_head.weight"]
    return found


def is_column_major(tensor: torch.Tensor) -> bool:
    n, k = tensor.shape[-2:]
    return tensor.stride()[-2:] == (1, n) and (tensor.dim() == 2 or tensor.stride(0) == n * k)


@pytest.mark.parametrize("kind", ["llama", "qwen2"])  # tied and untied LM heads
def test_float32_gemm_weights_are_column_major_with_the_checkpoints_values(kind):
    model_dir = tiny_checkpoint(kind)
    model, _ = load_model(model_dir, torch.float32, CPU)
    stored = checkpoint_tensors(model_dir)
    linears = [m for m in model.modules() if isinstance(m, nn.Linear)]
    assert linears
    for module in linears:
        assert is_column_major(module.weight)
    tied = model.lm_head is None
    assert tied == (kind == "llama")
    assert is_column_major(model.embed_tokens.weight) == tied
    for name, param in model.named_parameters():
        if param.dim() == 1:
            assert param.is_contiguous(), name  # norms and biases are untouched
        torch.testing.assert_close(param, stored[name], rtol=0, atol=0, msg=name)


def test_float32_experts_are_column_major_per_expert():
    model, _ = load_model(family_checkpoint("qwen3_moe"), torch.float32, CPU)
    experts = [m for m in model.modules() if type(m) is Experts]
    assert experts
    for module in experts:
        for weight in (module.gate_up_proj, module.down_proj):
            assert is_column_major(weight)
            assert is_column_major(weight[0])


def test_bf16_keeps_the_row_major_layout():
    model, _ = load_model(tiny_checkpoint("llama"), torch.bfloat16, CPU)
    assert all(param.is_contiguous() for param in model.parameters())
