"""The token contract a checkpoint must meet before Iris serves it (checked at load)."""

from __future__ import annotations

from iris.multimodal import check_vocab_size


class TokenContractError(ValueError):
    """The checkpoint's tokenizer and config disagree; the message names both values."""


def _first(value):
    # config eos_token_id may be a list (several stop ids): the first one is the canonical.
    if isinstance(value, list):
        return value[0] if value else None
    return value


def check_token_contract(
    *,
    tokenizer,
    text_config: dict,
    image_token: str,
    image_token_id: int | None,
    vocab_size: int,
) -> None:
    """Raise TokenContractError (or ValueError for the vocab) on the first broken rule.

    The one contract the engine, the gateway and the encoder all check (through
    `load_adapter`), so a checkpoint one of them serves, all serve."""
    tokenizer_image_id = tokenizer.convert_tokens_to_ids(image_token)
    if tokenizer_image_id is None or tokenizer_image_id == tokenizer.unk_token_id:
        raise TokenContractError(f"image token {image_token!r} is not in the tokenizer")
    if image_token_id != tokenizer_image_id:
        raise TokenContractError(
            f"image token {image_token!r}: config image_token_id={image_token_id} but the "
            f"tokenizer maps it to {tokenizer_image_id}"
        )
    _check_text_tokens(tokenizer, text_config, vocab_size)
    # pad = eos is fine (many checkpoints ship it): Iris never puts the pad token into a
    # prompt (batches are ragged, image spans hold sentinels), so no padding can read as
    # end of sequence. A pad that is the image token is not: it would read as a placeholder.
    pad = tokenizer.pad_token_id
    if pad is not None and pad == tokenizer_image_id:
        raise TokenContractError(
            f"pad_token_id={pad} is the image token {image_token!r}: padding would read as "
            "an image placeholder"
        )


def check_token_contract_text(*, tokenizer, text_config: dict, vocab_size: int) -> None:
    """The contract of a plain language model: the rules above that do not name images."""
    _check_text_tokens(tokenizer, text_config, vocab_size)


def _check_text_tokens(tokenizer, text_config: dict, vocab_size: int) -> None:
    check_vocab_size(vocab_size)
    check_vocab_size(len(tokenizer))
    max_id = max(tokenizer.get_vocab().values())
    if max_id >= vocab_size:
        raise TokenContractError(
            f"tokenizer has token id {max_id} but the model's vocab_size is {vocab_size}"
        )
    bos = tokenizer.bos_token_id
    bos = bos if bos is not None else _first(text_config.get("bos_token_id"))
    eos = tokenizer.eos_token_id
    eos = eos if eos is not None else _first(text_config.get("eos_token_id"))
    if bos is None or eos is None:
        raise TokenContractError(f"BOS and EOS must be defined: bos_token_id={bos}, eos={eos}")
