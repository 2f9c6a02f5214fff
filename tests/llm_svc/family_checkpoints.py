"""Tiny checkpoints of the decoder families (iris/models/text_tiny.py) with the options the
engine tests need: a sliding window of WINDOW tokens on some layers, router options set
away from their defaults, three layers so that both layer kinds and MLP kinds appear.
Built once per builder version under .cache/llm_svc_tests."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from iris.models.build import build_atomically
from tests.llm_svc.checkpoints import CACHE_ROOT

VERSION = "f2"
WINDOW = 8
FAMILIES = {
    # Layer 0 full, layers 1 and 2 slide (index >= max_window_layers).
    "qwen3": dict(
        num_hidden_layers=3, use_sliding_window=True, sliding_window=WINDOW, max_window_layers=1
    ),
    # Every layer slides; layer 1 is dense (mlp_only_layers); norm_topk_prob at its default.
    "qwen3_moe": dict(
        num_hidden_layers=3,
        use_sliding_window=True,
        sliding_window=WINDOW,
        mlp_only_layers=[1],
        norm_topk_prob=False,
    ),
    # Layer 0 slides (even and < max_window_layers); layer 2 is dense (mlp_only_layers).
    "qwen2_moe": dict(
        num_hidden_layers=3,
        use_sliding_window=True,
        sliding_window=WINDOW,
        max_window_layers=2,
        mlp_only_layers=[2],
        norm_topk_prob=True,
    ),
    # Every layer slides (Mistral reads only `sliding_window`).
    "mistral": dict(num_hidden_layers=2, sliding_window=WINDOW),
    "gemma3_text": dict(
        num_hidden_layers=3,
        sliding_window=WINDOW,
        layer_types=["sliding_attention", "sliding_attention", "full_attention"],
    ),
    # Six layers, sliding and full in turn, the last two reading layers 2 and 3's KV;
    # full layers wider (head_dim 32, 1 KV head) and keys equal values on them.
    "gemma4_text": dict(sliding_window=WINDOW),
    # gemma4_text with per-layer embeddings (16 wide), fed to the KV-shared layers too.
    "gemma4_text_ple": dict(sliding_window=WINDOW),
    # Four layers, each with the MoE block beside its dense MLP; no KV sharing. Seed 1: seed
    # 0's weights make EOS the greedy first token of one prompt (HF's min_new_tokens masks
    # it, the engine's ignore_eos does not).
    "gemma4_text_moe": dict(sliding_window=WINDOW, seed=1),
}


def family_checkpoint(arch: str) -> Path:
    """The directory of `arch`'s test checkpoint (built on first use)."""
    from iris.models.text_tiny import build

    return build_atomically(
        CACHE_ROOT / f"{arch}-{VERSION}", lambda out: build(arch, out, **FAMILIES[arch])
    )


def stacked_experts_copy(model_dir: Path, out: Path, transposed: bool = True) -> Path:
    """A copy of a per-expert MoE checkpoint with its experts stacked as the published
    Qwen3-VL-MoE checkpoints store them, `experts.gate_up_proj` [E, H, 2I] and
    `experts.down_proj` [E, I, H] (`transposed`), or as transformers 5.24's save_pretrained
    writes Qwen3-VL-MoE, [E, 2I, H] and [E, H, I]."""
    import torch
    from safetensors.torch import load_file, save_file

    def build(tmp: Path) -> None:
        for path in model_dir.iterdir():
            if path.suffix != ".safetensors" and path.is_file():
                shutil.copy(path, tmp / path.name)
        tensors = load_file(model_dir / "model.safetensors")
        experts: dict[str, dict[int, dict[str, torch.Tensor]]] = {}
        stacked = {}
        for name, tensor in tensors.items():
            if ".experts." not in name:
                stacked[name] = tensor
                continue
            base, _, rest = name.partition(".experts.")
            index, proj, _ = rest.split(".")
            experts.setdefault(base, {}).setdefault(int(index), {})[proj] = tensor
        for base, by_index in experts.items():
            order = sorted(by_index)
            gate_up = [torch.cat([by_index[e]["gate_proj"], by_index[e]["up_proj"]]) for e in order]
            down = [by_index[e]["down_proj"] for e in order]
            gate_up_stack, down_stack = torch.stack(gate_up), torch.stack(down)
            if transposed:
                gate_up_stack, down_stack = (
                    gate_up_stack.transpose(1, 2),
                    down_stack.transpose(1, 2),
                )
            stacked[f"{base}.experts.gate_up_proj"] = gate_up_stack
            stacked[f"{base}.experts.down_proj"] = down_stack
        save_file({k: v.contiguous() for k, v in stacked.items()}, tmp / "model.safetensors")
        (tmp / "layout.json").write_text(
            json.dumps({"experts": "stacked", "transposed": transposed})
        )

    return build_atomically(out, build)
