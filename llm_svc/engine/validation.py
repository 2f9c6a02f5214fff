"""Request checks at the engine's boundary: one place decides which token ids are valid."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from llm_svc.engine.errors import InvalidRequestError, RequestTooLargeError
from llm_svc.engine.sampling_params import SamplingParams


def check_token_ids(token_ids: Sequence[int], vocab_size: int) -> np.ndarray:
    """The prompt as int64; every id must lie in [0, vocab_size).

    This is the one place that decides which ids are allowed; the multimodal path will
    admit sentinel ids (>= 1_000_000) inside item spans here.
    """
    ids = np.asarray(token_ids, dtype=np.int64).reshape(-1)
    if ids.size == 0:
        raise InvalidRequestError("prompt_token_ids", [], "the prompt must not be empty")
    bad = np.flatnonzero((ids < 0) | (ids >= vocab_size))
    if bad.size:
        index = int(bad[0])
        raise InvalidRequestError(
            f"prompt_token_ids[{index}]", int(ids[index]), f"token ids must be in [0, {vocab_size})"
        )
    return ids


def check_request(
    token_ids: Sequence[int],
    params: SamplingParams,
    *,
    vocab_size: int,
    max_model_len: int,
    page_size: int,
    num_pages: int,
) -> list[int]:
    """Validate one request; returns its prompt ids as a list of ints."""
    ids = check_token_ids(token_ids, vocab_size)
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
    return ids.tolist()
