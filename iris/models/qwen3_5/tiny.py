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

# ChatML with tools in Qwen3.5's layout (its published template's structure, Iris's own
# wording): the tools as JSON lines in the system turn, each call written as Qwen XML
# (`<tool_call>\n<function=NAME>\n<parameter=P>\nVALUE\n</parameter>\n</function>\n
# </tool_call>`, a string value as it is, others as JSON), tool results as a user turn.
CHAT_TEMPLATE = (
    "{% if tools %}<|im_start|>system\n"
    "{% if messages[0]['role'] == 'system' %}{{ messages[0]['content'] }}\n\n{% endif %}"
    "# Tools\n\n<tools>{% for tool in tools %}{{ '\\n' }}{{ tool | tojson }}{% endfor %}"
    "{{ '\\n' }}</tools>\n\n"
    "To call a function reply with:\n<tool_call>\n<function=NAME>\n<parameter=P>\nVALUE\n"
    "</parameter>\n</function>\n</tool_call><|im_end|>\n{% endif %}"
    "{% for message in messages %}"
    "{% if tools and loop.first and message['role'] == 'system' %}"
    "{% elif message['role'] == 'tool' %}<|im_start|>user\n<tool_response>\n"
    "{{ message['content'] }}\n</tool_response><|im_end|>\n"
    "{% else %}<|im_start|>{{ message['role'] }}\n{{ message['content'] or '' }}"
    "{% for call in message.get('tool_calls') or [] %}"
    "{% set call = call['function'] if call['function'] is defined else call %}"
    "{% if not loop.first or message['content'] %}{{ '\\n' }}{% endif %}"
    "<tool_call>\n<function={{ call['name'] }}>\n"
    "{% for key, value in call['arguments'] | items %}<parameter={{ key }}>\n"
    "{% if value is string %}{{ value }}{% else %}{{ value | tojson }}{% endif %}"
    "{{ '\\n' }}</parameter>\n{% endfor %}</function>\n</tool_call>{% endfor %}<|im_end|>\n"
    "{% endif %}{% endfor %}"
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
