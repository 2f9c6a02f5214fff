"""A small real tokenizer built in code for the tiny checkpoints: byte-level BPE trained on
a short built-in corpus, plus the family's special tokens. No download, a few hundred ids."""

from __future__ import annotations

from pathlib import Path

_CORPUS = """
The quick brown fox jumps over the lazy dog. What is in this image? Describe the picture.
The capital of France is Paris. A cat sits on a red mat next to a blue chair.
User: hello there, how are you? Assistant: I am fine, thank you. 0123456789 + - * / = ( )
system user assistant image picture photo colour color left right top bottom centre
"""


# The language model's shape in every tiny checkpoint (one family's keys are added to it).
TINY_TEXT_SHAPE = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 4096,
}


def tiny_vocab(tokenizer, special_tokens: list[str]) -> tuple[dict[str, int], int]:
    """The special tokens' ids, and the vocabulary size rounded up to a multiple of 64 (the
    embedding rows, as real checkpoints pad them)."""
    ids = {token: tokenizer.token_to_id(token) for token in special_tokens}
    return ids, -(-tokenizer.get_vocab_size() // 64) * 64


def build_tokenizer(special_tokens: list[str], vocab_size: int = 400):
    """Train a byte-level BPE tokenizer on the built-in corpus; specials get the last ids."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    # Several copies so the merges are stable and cover common words.
    tokenizer.train_from_iterator([_CORPUS] * 8, trainer=trainer)
    tokenizer.add_special_tokens(special_tokens)
    return tokenizer


def save_fast_tokenizer(
    tokenizer,
    out_dir: Path,
    *,
    bos: str,
    eos: str,
    pad: str,
    chat_template: str,
    extra_special: list[str] | dict[str, str] | None = None,
):
    """Wrap a `tokenizers.Tokenizer` as a transformers fast tokenizer and save it in HF layout."""
    from transformers import PreTrainedTokenizerFast

    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        bos_token=bos,
        eos_token=eos,
        pad_token=pad,
        extra_special_tokens=extra_special or [],
    )
    fast.chat_template = chat_template
    fast.save_pretrained(str(out_dir))
    return fast
