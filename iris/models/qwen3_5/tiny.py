"""Build a tiny random Qwen3.5 language model (HF layout): hybrid, three Gated DeltaNet
layers then one gated full-attention layer, with partial rotary as the real ones."""

from __future__ import annotations

from pathlib import Path

from iris.models.tokenizer_build import (
    TINY_TEXT_SHAPE,
    build_tokenizer,
    save_fast_tokenizer,
    tiny_vocab,
)

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]

# ChatML, as Qwen3.5's template renders plain text turns.
CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{{ message['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

LINEAR_SHAPE = {
    "linear_num_key_heads": 2,
    "linear_num_value_heads": 4,
    "linear_key_head_dim": 16,
    "linear_value_head_dim": 8,
    "linear_conv_kernel_dim": 4,
}


def build(out_dir: Path, seed: int = 0) -> None:
    """Write a tiny Qwen3_5ForCausalLM: config, random weights, tokenizer."""
    import torch
    from transformers import Qwen3_5ForCausalLM, Qwen3_5TextConfig

    tokenizer = build_tokenizer(SPECIAL_TOKENS)
    ids, vocab_size = tiny_vocab(tokenizer, SPECIAL_TOKENS)
    linear, full = "linear_attention", "full_attention"
    config = Qwen3_5TextConfig(
        vocab_size=vocab_size,
        **{**TINY_TEXT_SHAPE, "num_hidden_layers": 4},
        layer_types=[linear, linear, linear, full],
        head_dim=16,  # partial_rotary_factor 0.25: 4 rotary dims
        **LINEAR_SHAPE,
        initializer_range=0.15,  # peaked logits: greedy output varies and has no ties
        bos_token_id=ids["<|endoftext|>"],
        eos_token_id=ids["<|im_end|>"],
        pad_token_id=ids["<|endoftext|>"],
        tie_word_embeddings=False,
    )
    config.architectures = [Qwen3_5ForCausalLM.__name__]
    torch.manual_seed(seed)
    model = Qwen3_5ForCausalLM(config).eval()
    model.save_pretrained(str(out_dir), safe_serialization=True)
    save_fast_tokenizer(
        tokenizer,
        out_dir,
        bos="<|endoftext|>",
        eos="<|im_end|>",
        pad="<|endoftext|>",
        chat_template=CHAT_TEMPLATE,
    )
