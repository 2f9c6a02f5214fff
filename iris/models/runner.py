"""The vision runner contract: preprocess on CPU (worker pool), encode a batch at once."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any


@dataclass
class PreparedImage:
    """One image after the family's image processor: tensors on CPU, ready to batch."""

    pixel_values: Any  # torch.Tensor, layout per family
    grid: tuple[int, ...]
    token_count: int
    extra: dict[str, Any] = field(default_factory=dict)


# Image-processor settings every HF processor Iris runs takes (normalisation, resampling).
COMMON_PROCESSOR_KEYS = (
    "image_mean",
    "image_std",
    "do_rescale",
    "rescale_factor",
    "do_normalize",
    "do_convert_rgb",
    "resample",
)


def processor_kwargs(preprocessor: dict, family_keys: tuple[str, ...]) -> dict:
    """The preprocessor_config.json entries to build a family's image processor from: the
    common keys and the family's own, those present."""
    keys = (*family_keys, *COMMON_PROCESSOR_KEYS)
    return {key: preprocessor[key] for key in keys if key in preprocessor}


class VisionRunner(ABC):
    """A checkpoint's vision tower and projector/merger, loaded without the language model."""

    hidden_size: int  # the width of a row it returns (the adapter's embedding_width)
    device: Any
    dtype: Any

    @abstractmethod
    def preprocess(self, image) -> PreparedImage:
        """PIL image (RGB, EXIF already applied) -> PreparedImage. CPU only, thread-safe."""

    @abstractmethod
    def encode(self, prepared: list[PreparedImage]) -> list:
        """One tower + projector call for the batch; per image a fresh contiguous
        [token_count, hidden_size] tensor on the runner's device, in its dtype (with
        deepstack levels, each row is the main row followed by every level's row)."""
