"""Model adapters (one per family, found by the config's `architectures`) and the tiny and
demo checkpoints. Importing this package does not import torch."""

from iris.models.base import Grid, ModelAdapter, Span
from iris.models.contract import TokenContractError
from iris.models.registry import (
    UnsupportedModelError,
    adapter_class,
    has_adapter,
    language_model_architectures,
    load_adapter,
    registered_architectures,
    text_family,
)
from iris.models.runner import PreparedImage, VisionRunner


def make_tiny(arch: str, out_dir):
    """Build (or keep, if complete) a tiny random checkpoint of family `arch`
    ("qwen2_vl" | "qwen2_5_vl" | "idefics3") in out_dir; returns its Path."""
    from iris.models.build import make_tiny as build

    return build(arch, out_dir)


def make_demo(out_dir, full_resolution: bool = False):
    """Build (or keep, if complete) the demo checkpoint: SmolVLM-256M's architecture with
    the real SmolLM2-135M-Instruct and a random SigLIP-base tower; returns its Path."""
    from iris.models.demo import make_demo as build

    return build(out_dir, full_resolution=full_resolution)


__all__ = [
    "Grid",
    "ModelAdapter",
    "PreparedImage",
    "Span",
    "TokenContractError",
    "UnsupportedModelError",
    "VisionRunner",
    "adapter_class",
    "has_adapter",
    "language_model_architectures",
    "load_adapter",
    "make_demo",
    "make_tiny",
    "registered_architectures",
    "text_family",
]
