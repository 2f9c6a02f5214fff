"""Vocabulary sanity: sentinels start at 1_000_000, so no real token id may reach it."""

from __future__ import annotations

from iris.multimodal.item import PAD_BASE


def check_vocab_size(vocab_size: int) -> None:
    """Raise ValueError at load if the model's vocabulary could collide with sentinels."""
    if vocab_size >= PAD_BASE:
        raise ValueError(
            f"vocab_size {vocab_size} >= {PAD_BASE}: token ids would collide with image sentinels"
        )
