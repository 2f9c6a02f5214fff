"""Qwen3.5's multi-token-prediction (MTP) layers: what the checkpoint holds. transformers'
Qwen3.5 has no MTP module and its config no MTP field, so the layer count is read from the
checkpoint's `mtp.layers.<i>.*` tensors. Drafting with them is not built yet
(docs/design/engine.md, "Speculative decoding")."""

from __future__ import annotations

import re
from pathlib import Path

_LAYER = re.compile(r"^mtp\.layers\.(\d+)\.")


def mtp_layer_count(model_dir: str | Path) -> int:
    """The MTP layers in `model_dir`'s safetensors (0: none)."""
    from safetensors import safe_open

    layers = set()
    for path in sorted(Path(model_dir).glob("*.safetensors")):
        with safe_open(str(path), framework="pt") as handle:
            for name in handle.keys():  # noqa: SIM118
                match = _LAYER.match(name)
                if match:
                    layers.add(int(match.group(1)))
    return len(layers)
