"""Build a tiny random Qwen3-VL or Qwen3-VL-MoE checkpoint (HF layout) for tests and local
runs: a 2-layer Qwen3 language model (q/k norms, interleaved M-RoPE), a 3-block vision
tower with two deepstack levels, a tokenizer with the vision tokens and Qwen3-VL's chat
template with Hermes tool calls."""

from __future__ import annotations

from pathlib import Path

from iris.models.qwen2_vl.tiny import SPECIAL_TOKENS, save_tiny_qwen_vl
from iris.models.tokenizer_build import (
    TINY_TEXT_SHAPE,
    build_tokenizer,
    tiny_vocab,
)

# ChatML as Qwen3-VL writes it: images as <|vision_start|><|image_pad|><|vision_end|>;
# tools listed in the system turn in <tools>, calls as Hermes JSON in <tool_call>, results
# in <tool_response> inside a user turn. (transformers renders with trim_blocks: a newline
# right after a block tag is written as {{ '\\n' }}.)
CHAT_TEMPLATE = (
    "{% macro render(content) %}"
    "{% if content is string %}{{ content }}"
    "{% elif content %}{% for part in content %}"
    "{% if part['type'] == 'image' %}<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif part['type'] == 'video' %}<|vision_start|><|video_pad|><|vision_end|>"
    "{% elif part['type'] == 'text' %}{{ part['text'] }}{% endif %}"
    "{% endfor %}{% endif %}"
    "{% endmacro %}"
    "{% if tools %}<|im_start|>system\n"
    "{% if messages[0]['role'] == 'system' %}{{ render(messages[0]['content']) }}\n\n"
    "{% endif %}"
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>"
    "{% for tool in tools %}{{ '\\n' }}{{ tool | tojson }}{% endfor %}{{ '\\n' }}</tools>\n\n"
    "For each function call, return a json object with function name and arguments within "
    "<tool_call></tool_call> XML tags:\n<tool_call>\n"
    '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call><|im_end|>\n'
    "{% endif %}"
    "{% for message in messages %}"
    "{% if message['role'] == 'system' and tools and loop.first %}"
    "{% elif message['role'] == 'tool' %}"
    "<|im_start|>user\n<tool_response>\n{{ render(message['content']) }}\n</tool_response>"
    "<|im_end|>\n"
    "{% else %}<|im_start|>{{ message['role'] }}\n{{ render(message['content']) }}"
    "{% if message['role'] == 'assistant' and message['tool_calls'] %}"
    "{% for call in message['tool_calls'] %}"
    "{% if render(message['content']) or not loop.first %}{{ '\\n' }}{% endif %}"
    '<tool_call>\n{"name": {{ call["function"]["name"] | tojson }}, "arguments": '
    '{{ call["function"]["arguments"] | tojson }}}\n</tool_call>'
    "{% endfor %}{% endif %}<|im_end|>\n"
    "{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

PREPROCESSOR = {
    "min_pixels": 32 * 32 * 4,
    # 512 x 512: at most 256 image tokens per image keeps the tests fast.
    "max_pixels": 32 * 32 * 256,
    "patch_size": 16,
    "temporal_patch_size": 2,
    "merge_size": 2,
    "image_mean": [0.5, 0.5, 0.5],
    "image_std": [0.5, 0.5, 0.5],
}

# Vision blocks 0 and 2 feed deepstack levels 0 and 1 (added after decoder layers 0 and 1).
DEEPSTACK_VISUAL_INDEXES = [0, 2]


def build(out_dir: Path, seed: int = 0) -> None:
    """Write a tiny Qwen3-VL: config, random weights, tokenizer, preprocessor config."""
    _build(out_dir, seed, moe=False)


def build_moe(out_dir: Path, seed: int = 0) -> None:
    """The same with a sparse MoE language model (4 experts, 2 per token; expert width 48,
    so no stored expert tensor is square and a transposed layout cannot pass)."""
    _build(out_dir, seed, moe=True)


def _text_config(ids: dict, vocab_size: int, moe: bool) -> dict:
    config = {
        "vocab_size": vocab_size,
        **TINY_TEXT_SHAPE,
        "head_dim": 16,
        # head_dim 16 -> 8 rotary frequencies, interleaved t h w t h w t h.
        "rope_parameters": {
            "rope_type": "default",
            "rope_theta": 10000.0,
            "mrope_section": [2, 3, 3],
            "mrope_interleaved": True,
        },
        # Wide enough that greedy output varies on a random model (ENVIRONMENT.md).
        "initializer_range": 0.15,
        "bos_token_id": ids["<|endoftext|>"],
        "eos_token_id": ids["<|im_end|>"],
        "pad_token_id": ids["<|endoftext|>"],
    }
    if moe:
        config |= {
            "num_experts": 4,
            "num_experts_per_tok": 2,
            "moe_intermediate_size": 48,
            "decoder_sparse_step": 1,
        }
    return config


def _vision_config() -> dict:
    return {
        "depth": 3,
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_heads": 2,
        "patch_size": PREPROCESSOR["patch_size"],
        "spatial_merge_size": PREPROCESSOR["merge_size"],
        "temporal_patch_size": PREPROCESSOR["temporal_patch_size"],
        "out_hidden_size": TINY_TEXT_SHAPE["hidden_size"],
        # A 4 x 4 learned grid, interpolated to each image's patch grid.
        "num_position_embeddings": 16,
        "deepstack_visual_indexes": DEEPSTACK_VISUAL_INDEXES,
        "initializer_range": 0.15,
    }


def _build(out_dir: Path, seed: int, moe: bool) -> None:
    if moe:
        from transformers import Qwen3VLMoeConfig as Config
        from transformers import Qwen3VLMoeForConditionalGeneration as Model
    else:
        from transformers import Qwen3VLConfig as Config
        from transformers import Qwen3VLForConditionalGeneration as Model

    tokenizer = build_tokenizer(SPECIAL_TOKENS)
    ids, vocab_size = tiny_vocab(tokenizer, SPECIAL_TOKENS)
    save_tiny_qwen_vl(
        out_dir, Model, Config, tokenizer, ids, seed, CHAT_TEMPLATE, PREPROCESSOR,
        text_config=_text_config(ids, vocab_size, moe), vision_config=_vision_config(),
    )  # fmt: skip
