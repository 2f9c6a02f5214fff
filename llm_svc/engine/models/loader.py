"""Load the language model's weights from a local HF directory (plain LM or inside a VLM).

The LM's prefix is found from where `embed_tokens.weight` sits (`model.` for a plain LM,
`model.text_model.` for Idefics3, `model.language_model.` for Qwen2-VL in transformers 5);
`lm_head.weight` is looked up at the top level and beside that prefix.
"""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors import safe_open

from llm_svc.engine.models.decoder import DecoderLM

_EMBED = "embed_tokens.weight"


def _tensor_files(model_dir: Path) -> list[Path]:
    files = sorted(model_dir.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no *.safetensors weights in {model_dir}")
    return files


def find_text_prefix(names: list[str]) -> str:
    """The prefix under which the language model's decoder lives in a checkpoint."""
    candidates = sorted(name[: -len(_EMBED)] for name in names if name.endswith(_EMBED))
    if not candidates:
        raise ValueError("checkpoint has no embed_tokens.weight: not a supported language model")
    return min(candidates, key=len)


def load_weights(model: DecoderLM, model_dir: str | Path, shards: dict | None = None) -> None:
    """Copy every parameter of `model` from the checkpoint; a missing one is an error.
    `shards[name]`, when given, cuts a tensor-parallel rank's slice of parameter `name`."""
    model_dir = Path(model_dir)
    files = _tensor_files(model_dir)
    where: dict[str, Path] = {}
    for path in files:
        with safe_open(path, framework="pt") as handle:
            where.update({name: path for name in handle.keys()})  # noqa: SIM118
    prefix = find_text_prefix(list(where))
    lm_head_names = ["lm_head.weight", prefix + "lm_head.weight"]
    if prefix.endswith("model."):
        lm_head_names.append(prefix[: -len("model.")] + "lm_head.weight")
    params = dict(model.named_parameters())
    wanted: dict[str, str] = {}
    for name in params:
        if name == "lm_head.weight":
            found = next((n for n in lm_head_names if n in where), None)
            if found is None:
                raise ValueError(f"no lm_head weight in {model_dir} (tried {lm_head_names})")
            wanted[found] = name
        else:
            wanted[prefix + name] = name
    missing = [name for name in wanted if name not in where]
    if missing:
        raise ValueError(f"{len(missing)} weights missing from {model_dir}, e.g. {missing[:3]}")
    with torch.no_grad():
        for path in files:
            with safe_open(path, framework="pt") as handle:
                for stored in handle.keys():  # noqa: SIM118
                    if stored in wanted:
                        target = params[wanted[stored]]
                        tensor = handle.get_tensor(stored)
                        if shards and wanted[stored] in shards:
                            tensor = shards[wanted[stored]](tensor)
                        if tensor.shape != target.shape:
                            raise ValueError(
                                f"{stored}: shape {tuple(tensor.shape)} in checkpoint, "
                                f"model expects {tuple(target.shape)}"
                            )
                        target.copy_(tensor.to(target.dtype))
