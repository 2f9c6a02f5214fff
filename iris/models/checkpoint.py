"""Reading an HF checkpoint directory: config files and safetensors tensor names without
torch, and a subset of tensors (by name prefix) with it, so a vision runner never loads the
language model's weights."""

from __future__ import annotations

import json
import struct
from collections.abc import Iterable
from pathlib import Path

INDEX_FILE = "model.safetensors.index.json"
SINGLE_FILE = "model.safetensors"


def read_json(path: Path) -> dict | None:
    """A JSON file's content, or None if the file does not exist."""
    return json.loads(path.read_text()) if path.is_file() else None


def read_config(model_dir: Path) -> dict:
    """config.json of a model directory; a clear error if it is missing."""
    config = read_json(model_dir / "config.json")
    if config is None:
        raise FileNotFoundError(f"no config.json in model directory {model_dir}")
    return config


def read_preprocessor(model_dir: Path) -> dict:
    """The image processor settings: preprocessor_config.json, else the `image_processor`
    section of processor_config.json (the layout transformers 5 writes), else {}."""
    preprocessor = read_json(model_dir / "preprocessor_config.json")
    if preprocessor is not None:
        return preprocessor
    processor = read_json(model_dir / "processor_config.json") or {}
    return dict(processor.get("image_processor") or {})


def _safetensors_header(path: Path) -> dict:
    # The format starts with an 8-byte little-endian header length, then a JSON header.
    with path.open("rb") as handle:
        (length,) = struct.unpack("<Q", handle.read(8))
        header = json.loads(handle.read(length))
    header.pop("__metadata__", None)
    return header


def weight_files(model_dir: Path) -> dict[str, Path]:
    """Tensor name -> the safetensors file holding it (single file or sharded index)."""
    index = read_json(model_dir / INDEX_FILE)
    if index is not None:
        return {name: model_dir / file for name, file in index["weight_map"].items()}
    single = model_dir / SINGLE_FILE
    if not single.is_file():
        raise FileNotFoundError(f"no {SINGLE_FILE} or {INDEX_FILE} in {model_dir}")
    return dict.fromkeys(_safetensors_header(single), single)


def find_prefix(names: Iterable[str], suffix: str, exclude: tuple[str, ...] = ()) -> str | None:
    """The shortest prefix p such that p + suffix is a tensor name (names containing any of
    `exclude` are skipped), or None."""
    found = [
        name[: -len(suffix)]
        for name in names
        if name.endswith(suffix) and not any(part in name for part in exclude)
    ]
    return min(found, key=len) if found else None


def load_tensors(model_dir: Path, prefix: str) -> dict:
    """Every tensor whose name starts with `prefix`, keyed by the rest of its name (torch)."""
    from safetensors import safe_open

    by_file: dict[Path, list[str]] = {}
    for name, file in weight_files(model_dir).items():
        if name.startswith(prefix):
            by_file.setdefault(file, []).append(name)
    tensors = {}
    for file, names in by_file.items():
        with safe_open(str(file), framework="pt") as handle:
            for name in names:
                tensors[name[len(prefix) :]] = handle.get_tensor(name)
    if not tensors:
        raise ValueError(f"no tensors under prefix {prefix!r} in {model_dir}")
    return tensors
