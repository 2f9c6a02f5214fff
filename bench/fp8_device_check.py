"""Device check of the FP8 W8A8 path (`torch._scaled_mm`) on an sm_89+ GPU.

The path is tested on the CPU (tests/llm_svc/test_fp8.py), where torch's `_scaled_mm` runs;
on CUDA it has NOT yet run (docs/design/parallelism.md). This script is what would show it does:

1. `_scaled_mm` with row-wise scales and bf16 output runs on the device (the load-time probe
   says so, and the GPU is sm_89 or newer);
2. for each W8A8 layout (per-tensor, per-channel, static input_scale) of a tiny Llama with
   160/288/80-wide layers, the engine loads on CUDA in bf16 with every quantized layer on
   `_scaled_mm`, and each layer's output on random rows matches a float32 reference (the
   dequantized weight, the same per-token FP8 rounding of the input) within bf16 rounding;
3. a layer whose dimensions are not multiples of 16 falls back to weight-only;
4. the engine answers greedy requests on it.

Run: `python bench/fp8_device_check.py` (exit status 0 = every check passed), then
`python bench/engine.py --only fp8 --device cuda` for the throughput figures.
`--device cpu` runs the same checks on the CPU (how this script itself was tried).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
from torch import nn

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from iris.models.quantization import read_quantization  # noqa: E402
from llm_svc.engine import EngineConfig, LLMEngine, SamplingParams  # noqa: E402
from llm_svc.engine.models.quantization import (  # noqa: E402
    Fp8ScaledLinear,
    _uses_scaled_mm,
    scaled_mm_runs,
)
from tests.llm_svc.fp8_checkpoints import (  # noqa: E402
    FP8,
    FP8_MAX,
    STATIC_INPUT_SCALE,
    W8A8_LAYOUTS,
    odd_llama,
    quantize,
)

TOLERANCE = 2e-2  # of the output's largest magnitude: bf16 output rounding, and accumulation


def reference(layer: Fp8ScaledLinear, x: torch.Tensor, static: float | None) -> torch.Tensor:
    x32 = x.float()
    if static is None:
        scale = x32.abs().amax(dim=-1, keepdim=True).clamp(min=1e-12) / FP8_MAX
    else:
        scale = torch.tensor(static, device=x.device)
    rounded = (x32 / scale).clamp(-FP8_MAX, FP8_MAX).to(FP8).float() * scale
    out = rounded @ layer.dense_weight().t()
    return out if layer.bias is None else out + layer.bias.float()


def check_layout(layout: str, device: str) -> list[str]:
    failures = []
    engine = LLMEngine(
        EngineConfig(quantize(odd_llama(), layout), device=device, dtype="bfloat16", num_pages=64)
    )
    layers = {
        name: m for name, m in engine.runner.model.named_modules() if isinstance(m, Fp8ScaledLinear)
    }
    if len(layers) != 13:
        failures.append(f"{layout}: {len(layers)} W8A8 layers, want 13")
    static = STATIC_INPUT_SCALE if layout == "static" else None
    generator = torch.Generator(device=device).manual_seed(0)
    for name, layer in layers.items():
        x = torch.randn(37, layer.in_features, device=device, generator=generator)
        x = x.to(torch.bfloat16)
        with torch.inference_mode():
            got, want = layer(x).float(), reference(layer, x, static)
        error = ((got - want).abs().max() / want.abs().max()).item()
        status = "ok" if error < TOLERANCE else "FAIL"
        print(f"  {layout:8s} {name:32s} relative error {error:.2e} {status}")
        if error >= TOLERANCE:
            failures.append(f"{layout} {name}: relative error {error:.2e}")
    params = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
    engine.add_request("check", [5, 6, 7, 8, 9], params)
    tokens = []
    while engine.has_unfinished():
        tokens += [t for out in engine.step() for t in out.new_token_ids]
    print(f"  {layout}: greedy tokens {tokens}")
    if len(tokens) != 8:
        failures.append(f"{layout}: {len(tokens)} greedy tokens, want 8")
    return failures


def main() -> int:
    device = sys.argv[sys.argv.index("--device") + 1] if "--device" in sys.argv else "cuda"
    capability = (0, 0)
    if device == "cuda":
        if not torch.cuda.is_available():
            print("no CUDA device: nothing to check")
            return 2
        capability = torch.cuda.get_device_capability()
        name = torch.cuda.get_device_name()
        print(f"{name} sm_{capability[0]}{capability[1]}, torch {torch.__version__}")
    runs = scaled_mm_runs(device, torch.bfloat16)
    print(f"_scaled_mm (row-wise scales, bf16 out) runs on {device}: {runs}")
    if not runs or (device == "cuda" and capability < (8, 9)):
        print("FAIL: the W8A8 path needs a working _scaled_mm (CUDA: sm_89+)")
        return 1
    failures = []
    config = json.loads((quantize(odd_llama(), "channel") / "config.json").read_text())
    scheme = read_quantization(config)
    if device == "cuda" and _uses_scaled_mm(scheme, nn.Linear(200, 40), device, torch.bfloat16):
        failures.append("a 200x40 layer would run _scaled_mm (cuBLASLt needs multiples of 16)")
    for layout in W8A8_LAYOUTS:
        failures += check_layout(layout, device)
    print("\n".join(["FAILED:", *failures]) if failures else "all FP8 device checks passed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
