"""Embeddings from an in-process vision tower: the offline `LLM.generate(..., images=...)`,
the only place an engine encodes images."""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable, Mapping
from typing import Any

import torch

from iris.models.runner import VisionRunner
from iris.multimodal import MultimodalItem
from llm_svc.engine.embeddings.base import EmbeddingSource
from llm_svc.engine.errors import EmbeddingMissingError, ImageFailedError


class VisionEmbeddingSource(EmbeddingSource):
    """Images are registered by item key (`register`, once per request using them) and
    encoded on first fetch, all missing ones of a fetch in one tower call; an embedding stays
    while any registration holds it, so each image is encoded once (`num_encoded` counts).
    `runner` may be a factory, called on the first encode (loading the tower takes time)."""

    def __init__(self, runner: VisionRunner | Callable[[], VisionRunner]) -> None:
        self._runner = runner
        self.num_encoded = 0
        self._images: dict[bytes, Any] = {}
        self._refs: Counter[bytes] = Counter()
        self._encoded: dict[bytes, torch.Tensor] = {}
        self._lock = threading.Lock()

    @property
    def runner(self) -> VisionRunner:
        if not isinstance(self._runner, VisionRunner):
            self._runner = self._runner()
        return self._runner

    def register(self, key: bytes, image) -> None:
        """Make `image` (a PIL image, EXIF applied) available under `key`."""
        with self._lock:
            self._images.setdefault(key, image)
            self._refs[key] += 1

    def unregister(self, key: bytes) -> None:
        """Undo one `register`; the image and its embedding go with the last one."""
        with self._lock:
            self._refs[key] -= 1
            if self._refs[key] <= 0:
                del self._refs[key]
                self._images.pop(key, None)
                self._encoded.pop(key, None)

    def fetch(
        self, items: Mapping[int, MultimodalItem], hidden: int, dtype: torch.dtype
    ) -> dict[int, torch.Tensor]:
        # One lock around encoding: the tower runs one batch at a time, and two requests
        # with the same image must not encode it twice.
        with self._lock:
            self._encode_missing(items)
            out = {}
            for index, item in items.items():
                embedding = self._encoded.get(item.key)
                if embedding is None:
                    raise EmbeddingMissingError(f"items[{index}] was never registered", index)
                out[index] = embedding.to(dtype)
            return out

    def _encode_missing(self, items: Mapping[int, MultimodalItem]) -> None:
        todo: dict[bytes, int] = {}
        for index, item in items.items():
            if item.key not in self._encoded and item.key in self._images:
                todo.setdefault(item.key, index)
        if not todo:
            return
        prepared = []
        for key, index in todo.items():
            try:
                prepared.append(self.runner.preprocess(self._images[key]))
            except Exception as err:  # a bad image fails its request only
                raise ImageFailedError(f"items[{index}]: {err}", index) from err
        for key, embedding in zip(todo, self.runner.encode(prepared), strict=True):
            self._encoded[key] = embedding
        self.num_encoded += len(prepared)
