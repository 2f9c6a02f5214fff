"""Request checks at the engine's boundary: one place decides which token ids are valid."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from iris.multimodal import SALT_BYTES, MultimodalItem, check_spans
from llm_svc.engine.errors import InvalidRequestError, RequestTooLargeError
from llm_svc.engine.sampling_params import SamplingParams
from llm_svc.engine.window_pages import WindowNeed


def check_token_ids(
    token_ids: Sequence[int],
    vocab_size: int,
    items: Sequence[MultimodalItem] = (),
    image_token_id: int | None = None,
    video_token_id: int | None = None,
) -> np.ndarray:
    """The prompt as int64. This is the one place that decides which ids are allowed: ids
    inside an item's spans must be that item's sentinels in rotation (its
    `padding_sequence`); every other id must lie in [0, vocab_size) and must not be the
    model's image or video placeholder token (an image or frame group without an item).
    Items are checked first (`check_items`)."""
    ids = np.asarray(token_ids, dtype=np.int64).reshape(-1)
    if ids.size == 0:
        raise InvalidRequestError("prompt_token_ids", [], "the prompt must not be empty")
    text = np.ones(ids.size, dtype=bool)
    for index, item in enumerate(items):
        expected = np.asarray(item.padding_sequence(item.span_token_count), dtype=np.int64)
        cursor = 0
        for start, end in item.offsets:
            text[start : end + 1] = False
            got = ids[start : end + 1]
            want = expected[cursor : cursor + got.size]
            cursor += got.size
            wrong = np.flatnonzero(got != want)
            if wrong.size:
                at = start + int(wrong[0])
                raise InvalidRequestError(
                    f"prompt_token_ids[{at}]",
                    int(ids[at]),
                    f"must be sentinel {int(want[wrong[0]])} of items[{index}] (its span "
                    f"({start}, {end}) must be filled with the item's pad values)",
                )
    bad = np.flatnonzero(text & ((ids < 0) | (ids >= vocab_size)))
    if bad.size:
        index = int(bad[0])
        raise InvalidRequestError(
            f"prompt_token_ids[{index}]", int(ids[index]), f"token ids must be in [0, {vocab_size})"
        )
    if image_token_id is not None:
        stray = np.flatnonzero(text & (ids == image_token_id))
        if stray.size:
            raise InvalidRequestError(
                f"prompt_token_ids[{int(stray[0])}]",
                image_token_id,
                f"image placeholder outside every item's span: the prompt has more images "
                f"than its {len(items)} item(s)",
            )
    if video_token_id is not None:
        stray = np.flatnonzero(text & (ids == video_token_id))
        if stray.size:
            raise InvalidRequestError(
                f"prompt_token_ids[{int(stray[0])}]",
                video_token_id,
                f"video placeholder outside every item's span: the prompt has more video "
                f"frame groups than its {len(items)} item(s)",
            )
    return ids


def check_items(items: Sequence[MultimodalItem], length: int, *, accepts_images: bool) -> None:
    """An item list fit for a prompt of `length` ids: keyed (identity or hash), spans inside
    the prompt and disjoint, `token_count` = the spans' total."""
    if not items:
        return
    if not accepts_images:
        why = "this engine takes no images (a text-only model, or no embedding source)"
        raise InvalidRequestError("items", f"{len(items)} item(s)", why)
    for index, item in enumerate(items):
        if not item.pad_values or (item.identity is None and item.hash is None):
            raise InvalidRequestError(f"items[{index}]", "no key", "needs an identity or a hash")
        if not item.offsets:
            raise InvalidRequestError(f"items[{index}].offsets", [], "needs at least one span")
        if item.token_count != item.span_token_count or item.token_count < 1:
            raise InvalidRequestError(
                f"items[{index}].token_count",
                item.token_count,
                f"must equal the span lengths' sum {item.span_token_count} (and be >= 1)",
            )
    try:
        check_spans(items, length)
    except ValueError as err:
        offsets = [item.offsets for item in items]
        raise InvalidRequestError("items offsets", offsets, str(err)) from None


def check_request(
    token_ids: Sequence[int],
    params: SamplingParams,
    *,
    vocab_size: int,
    max_model_len: int,
    page_size: int,
    num_pages: int,
    items: Sequence[MultimodalItem] = (),
    accepts_images: bool = False,
    image_token_id: int | None = None,
    video_token_id: int | None = None,
    window_need: WindowNeed | None = None,
    num_window_pages: int = 0,
) -> list[int]:
    """Validate one request; returns its prompt ids as a list of ints. A request it admits
    fits every pool alone (`window_need`: a model with sliding layers' window pool of
    `num_window_pages`), so it never waits on pages no one will free."""
    check_items(items, len(token_ids), accepts_images=accepts_images)
    ids = check_token_ids(token_ids, vocab_size, items, image_token_id, video_token_id)
    if ids.size >= max_model_len:
        raise InvalidRequestError(
            "prompt length", int(ids.size), f"must be < max_model_len {max_model_len}"
        )
    params.validate(vocab_size)
    # Generation stops at max_model_len, so that bounds what the request can ever hold.
    longest = min(int(ids.size) + params.max_tokens, max_model_len)
    pages = -(-longest // page_size)
    if pages > num_pages:
        raise RequestTooLargeError(
            "prompt length + max_tokens",
            longest,
            f"needs {pages} KV pages of {page_size} tokens but the cache has {num_pages}",
        )
    if window_need is not None and window_need.pages(longest) > num_window_pages:
        raise RequestTooLargeError(
            "prompt length + max_tokens",
            longest,
            f"needs {window_need.pages(longest)} sliding-window KV pages of {page_size} "
            f"tokens but the window pool has {num_window_pages}",
        )
    return ids.tolist()


def check_cache_salt(salt: bytes) -> None:
    """A prefix-cache salt is empty (the shared namespace) or 32 bytes (a tenant's)."""
    if not isinstance(salt, (bytes, bytearray)) or len(salt) not in (0, SALT_BYTES):
        size = len(salt) if isinstance(salt, (bytes, bytearray)) else type(salt).__name__
        raise InvalidRequestError("cache_salt", size, f"must be empty or {SALT_BYTES} bytes")
