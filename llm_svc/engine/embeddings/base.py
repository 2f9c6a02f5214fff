"""The contract of an embedding source."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping

import torch

from iris.multimodal import MultimodalItem


class EmbeddingSource(ABC):
    """Gives the engine the embeddings of a request's images.

    `fetch` blocks (the fetcher calls it on its own threads, never on the engine loop) and
    returns, per requested item index, a [token_count, hidden] tensor in `dtype` — or raises
    ImageFailedError (the image cannot be encoded: its reason), EmbeddingMissingError
    (nowhere to be found, or still pending at the deadline) or CacheUnavailableError.
    `release` says the engine no longer uses items it fetched. Thread-safe.
    """

    @abstractmethod
    def fetch(
        self, items: Mapping[int, MultimodalItem], hidden: int, dtype: torch.dtype
    ) -> dict[int, torch.Tensor]:
        """The embeddings of `items` (request item index → item), keyed the same way."""

    def release(self, items: list[MultimodalItem]) -> None:  # noqa: B027 - optional hook
        """The engine is done with these items' embeddings (default: nothing to do)."""

    def report_corrupt(self, item: MultimodalItem, reason: str) -> None:  # noqa: B027
        """The embedding fetched for `item` is damaged (NaN or infinite values): tell its
        store, which checks and drops it (default: nothing to tell)."""

    def close(self) -> None:  # noqa: B027 - optional hook
        """Free connections or models (default: nothing to do)."""
