"""The adapter of a plain language model (Qwen3, Qwen3-MoE, Gemma 3 text, Qwen3.5, Llama...):
no images, so no counting, no expansion and no vision runner. Its chat template, tool
format and reasoning are read from the checkpoint as for a vision-language model; the
gateway refuses an image part by name (gateway/intake/prompt.py) before anything here runs.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

from iris.models.base import Grid, ModelAdapter, Span
from iris.models.contract import check_token_contract_text
from iris.models.registry import UnsupportedModelError, text_family


class TextOnlyAdapter(ModelAdapter):
    """Serves every architecture in the registry's plain language models; not `@register`ed,
    so `has_adapter` stays False for them (the engine and the encoder read that as "no
    images")."""

    takes_images: ClassVar[bool] = False
    image_token = ""
    image_placeholder_text = ""

    @classmethod
    def text_family_of(cls, config: dict) -> str:
        return text_family((config.get("architectures") or [""])[0])

    @property
    def text_family(self) -> str:  # type: ignore[override]
        return text_family(self.architecture)

    @property
    def image_token_id(self) -> int | None:
        return None

    def check_token_contract(self) -> None:
        check_token_contract_text(
            tokenizer=self.tokenizer(), text_config=self.text_config, vocab_size=self.vocab_size
        )

    def image_token_count(self, width: int, height: int) -> tuple[int, Grid]:
        raise UnsupportedModelError(f"{self.architecture} takes no images")

    def expand_prompt(
        self, input_ids: Sequence[int], grids: Sequence[Grid]
    ) -> tuple[list[int], list[list[Span]]]:
        if grids:
            raise ValueError(f"{self.architecture} takes no images, got {len(grids)} grid(s)")
        return list(input_ids), []

    def vision_runner(self, device: Any = "cpu", dtype: Any = None):
        raise UnsupportedModelError(f"{self.architecture} has no vision tower")
