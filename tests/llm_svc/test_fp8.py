"""FP8 checkpoints (issue 37): each layout loads with its weights kept in FP8 and answers as
its reference does, greedy token for greedy token.

- weight-only layers (block-wise scales; per-channel without an activation scheme): the
  reference is the plain float32 checkpoint of the dequantized weights;
- W8A8 layers (`torch._scaled_mm`, which runs on this CPU): the same checkpoint, with each
  of those layers' input sent through the same FP8 quantization (per token, or the static
  `input_scale`) in float32.
A token may differ only where the reference's top two log-probabilities were within 1e-3
(a reordered float sum may flip a near-tie); after it, the continuations are unrelated.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from llm_svc.engine.models.quantization import Fp8Linear, Fp8ScaledLinear
from tests.llm_svc.conftest import greedy, make_engine, run_all
from tests.llm_svc.fp8_checkpoints import (
    FP8,
    FP8_MAX,
    KEPT,
    STATIC_INPUT_SCALE,
    W8A8_LAYOUTS,
    dequantized,
    odd_llama,
    quantize,
)

PROMPTS = [
    "The quick brown fox jumps over",
    "The capital of France is Paris. A cat sat on the mat",
]
NEW_TOKENS = 10
NEAR_TIE = 1e-3


@pytest.fixture(scope="module")
def odd():
    return odd_llama()


def _generate(engine) -> list[tuple[list[int], list]]:
    requests = {
        str(i): (engine.tokenizer(text)["input_ids"], greedy(NEW_TOKENS, logprobs=2))
        for i, text in enumerate(PROMPTS)
    }
    outputs = run_all(engine, requests)
    results = []
    for i in range(len(PROMPTS)):
        tokens = [t for out in outputs[str(i)] for t in out.new_token_ids]
        logprobs = [lp for out in outputs[str(i)] for lp in out.new_logprobs]
        results.append((tokens, logprobs))
    return results


def _assert_matches(got, reference) -> None:
    for index, ((tokens, _), (expected, logprobs)) in enumerate(zip(got, reference, strict=True)):
        assert len(tokens) == len(expected) == NEW_TOKENS
        for step, (token, want) in enumerate(zip(tokens, expected, strict=True)):
            if token != want:
                (_, first), (_, second) = logprobs[step].top[:2]
                assert first - second < NEAR_TIE, (
                    f"prompt {index} step {step}: {token} != {want}, reference top-2 gap "
                    f"{first - second:.2e} is not a near-tie"
                )
                break  # the continuations now follow different contexts


def _layers(engine) -> dict[str, nn.Module]:
    return dict(engine.runner.model.named_modules())


@pytest.mark.parametrize("layout", ["block", "weight-only"])
def test_weight_only_layout_matches_dequantized_checkpoint(odd, layout):
    quantized = quantize(odd, layout)
    engine = make_engine(quantized, dtype="float32")
    layers = _layers(engine)
    fp8 = [name for name, m in layers.items() if isinstance(m, Fp8Linear)]
    # 7 linears per layer, less the one the config keeps; none of them W8A8.
    assert len(fp8) == 13 and not any(isinstance(layers[n], Fp8ScaledLinear) for n in fp8)
    assert all(layers[name].weight.dtype == FP8 for name in fp8)
    assert type(layers[KEPT]) is nn.Linear and type(layers["lm_head"]) is nn.Linear
    reference = make_engine(dequantized(quantized), dtype="float32")
    _assert_matches(_generate(engine), _generate(reference))


class FakeQuantInput(nn.Module):
    """The reference W8A8 layer: the dense float32 layer, its input rounded through FP8
    (per token from its absolute maximum, or by a static scale) and back."""

    def __init__(self, linear: nn.Linear, static_scale: float | None) -> None:
        super().__init__()
        self.linear, self.static_scale = linear, static_scale

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        if self.static_scale is None:
            scale = x32.abs().amax(dim=-1, keepdim=True).clamp(min=1e-12) / FP8_MAX
        else:
            scale = torch.tensor(self.static_scale)
        rounded = (x32 / scale).clamp(-FP8_MAX, FP8_MAX).to(FP8).float() * scale
        return self.linear(rounded.to(x.dtype))


@pytest.mark.parametrize("layout", W8A8_LAYOUTS)
def test_w8a8_layout_matches_fp8_activation_reference(odd, layout):
    quantized = quantize(odd, layout)
    engine = make_engine(quantized, dtype="float32")
    scaled = [name for name, m in _layers(engine).items() if isinstance(m, Fp8ScaledLinear)]
    assert len(scaled) == 13
    reference = make_engine(dequantized(quantized), dtype="float32")
    model = reference.runner.model
    static = STATIC_INPUT_SCALE if layout == "static" else None
    for name in scaled:
        parent, _, child = name.rpartition(".")
        owner = model.get_submodule(parent)
        setattr(owner, child, FakeQuantInput(getattr(owner, child), static))
    _assert_matches(_generate(engine), _generate(reference))


def test_fp8_layers_take_half_the_bytes_of_bf16(odd):
    engine = make_engine(quantize(odd, "block"), dtype="bfloat16")
    fp8_bytes = bf16_bytes = 0
    for module in engine.runner.model.modules():
        if isinstance(module, Fp8Linear):
            fp8_bytes += sum(p.numel() * p.element_size() for p in module.parameters())
            bf16_bytes += module.weight.numel() * 2
    assert 0.5 <= fp8_bytes / bf16_bytes < 0.51


def test_vision_tower_dequantized_at_load_gives_the_same_embeddings(tiny_idefics3_dir):
    """The encoder and the offline LLM load an FP8 VLM (tower, connector and LM in FP8) and
    embed an image as the dequantized checkpoint does."""
    from PIL import Image

    from encoder_svc.server import load_model
    from encoder_svc.settings import EncoderSettings
    from llm_svc.llm import LLM

    quantized = quantize(tiny_idefics3_dir, "channel")
    image = Image.frombytes("RGB", (48, 40), bytes(range(256)) * 22 + bytes(208))

    def embeddings(runner) -> torch.Tensor:
        return runner.encode([runner.preprocess(image)])[0]

    expected = embeddings(load_model(EncoderSettings(model=str(dequantized(quantized)))).runner)
    encoder = load_model(EncoderSettings(model=str(quantized))).runner
    assert all(p.dtype == torch.float32 for p in encoder.tower.parameters())
    torch.testing.assert_close(embeddings(encoder), expected, rtol=1e-5, atol=1e-6)
    offline = LLM(quantized, page_size=4, num_pages=64, dtype="float32")
    layers = offline.engine.runner.model.modules()
    assert sum(isinstance(m, Fp8ScaledLinear) for m in layers) == 13
    torch.testing.assert_close(embeddings(offline.vision.runner), expected, rtol=1e-5, atol=1e-6)


def test_config_and_weights_that_disagree_are_refused(odd, tmp_path):
    """A layer the config leaves unquantized but the checkpoint stores with a scale."""
    import json

    from llm_svc.engine.models import load_model

    quantized = quantize(odd, "channel")
    for item in quantized.iterdir():
        (tmp_path / item.name).symlink_to(item)
    config = json.loads((quantized / "config.json").read_text())
    config["quantization_config"]["ignore"].append("re:.*q_proj")
    (tmp_path / "config.json").unlink()
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="leaves unquantized have FP8 scales.*q_proj"):
        load_model(tmp_path, torch.float32, torch.device("cpu"))
