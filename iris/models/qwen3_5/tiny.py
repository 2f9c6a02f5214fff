"""Build tiny random Qwen3.5 checkpoints (HF layout): the hybrid language model (three Gated
DeltaNet layers then one gated full-attention layer, with partial rotary as the real ones),
its MoE variant (every MLP experts plus a gated shared expert), and the image-text models
of both (Qwen3-VL's vision tower without deepstack, interleaved M-RoPE)."""

from __future__ import annotations

from pathlib import Path

from iris.models.qwen2_vl.tiny import SPECIAL_TOKENS as VL_SPECIAL_TOKENS
from iris.models.qwen2_vl.tiny import save_tiny_qwen_vl
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

# The image-text models' template: the same, with a message's content parts rendered
# (an image as <|vision_start|><|image_pad|><|vision_end|>, a video with <|video_pad|>).
_RENDER = (
    "{% macro render(content) %}"
    "{% if content is string %}{{ content }}"
    "{% elif content %}{% for part in content %}"
    "{% if part['type'] == 'image' %}<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif part['type'] == 'video' %}<|vision_start|><|video_pad|><|vision_end|>"
    "{% elif part['type'] == 'text' %}{{ part['text'] }}{% endif %}"
    "{% endfor %}{% endif %}"
    "{% endmacro %}"
)
VL_CHAT_TEMPLATE = _RENDER + (
    CHAT_TEMPLATE.replace("{{ messages[0]['content'] }}", "{{ render(messages[0]['content']) }}")
    .replace("{{ message['content'] }}", "{{ render(message['content']) }}")
    .replace("{{ message['content'] or '' }}", "{{ render(message['content']) }}")
)

LINEAR_SHAPE = {
    "linear_num_key_heads": 2,
    "linear_num_value_heads": 4,
    "linear_key_head_dim": 16,
    "linear_value_head_dim": 8,
    "linear_conv_kernel_dim": 4,
}
# Qwen3.5-MoE's MLPs: 4 experts, 2 per token, expert width 48 (no stored expert tensor is
# square, so a transposed layout cannot pass), a shared expert of width 40.
MOE_SHAPE = {
    "num_experts": 4,
    "num_experts_per_tok": 2,
    "moe_intermediate_size": 48,
    "shared_expert_intermediate_size": 40,
}
# The image-text models: head_dim 16 x partial_rotary_factor 0.5 = 4 rotary frequencies,
# interleaved t h w t (mrope_section [2, 1, 1]), so every position row turns some of them.
VL_ROPE = {
    "rope_type": "default",
    "rope_theta": 10000.0,
    "partial_rotary_factor": 0.5,
    "mrope_section": [2, 1, 1],
    "mrope_interleaved": True,
}


def _text_config(ids: dict, vocab_size: int, moe: bool) -> dict:
    linear, full = "linear_attention", "full_attention"
    shape = dict(TINY_TEXT_SHAPE, num_hidden_layers=4)
    if moe:
        del shape["intermediate_size"]  # Qwen3.5-MoE has no dense MLP
    return {
        "vocab_size": vocab_size,
        **shape,
        "layer_types": [linear, linear, linear, full],
        "head_dim": 16,  # partial_rotary_factor 0.25 (the default): 4 rotary dims
        **LINEAR_SHAPE,
        **(MOE_SHAPE if moe else {}),
        "initializer_range": 0.15,  # peaked logits: greedy output varies and has no ties
        "bos_token_id": ids["<|endoftext|>"],
        "eos_token_id": ids["<|im_end|>"],
        "pad_token_id": ids["<|endoftext|>"],
        "tie_word_embeddings": False,
    }


def build(out_dir: Path, seed: int = 0) -> None:
    """Write a tiny Qwen3_5ForCausalLM: config, random weights, tokenizer."""
    _build_text(out_dir, seed, moe=False)


def build_moe(out_dir: Path, seed: int = 0) -> None:
    """Write a tiny Qwen3_5MoeForCausalLM: config, random weights, tokenizer."""
    _build_text(out_dir, seed, moe=True)


def _build_text(out_dir: Path, seed: int, moe: bool) -> None:
    import torch

    if moe:
        from transformers import Qwen3_5MoeForCausalLM as Model
        from transformers import Qwen3_5MoeTextConfig as Config
    else:
        from transformers import Qwen3_5ForCausalLM as Model
        from transformers import Qwen3_5TextConfig as Config

    tokenizer = build_tokenizer(SPECIAL_TOKENS)
    ids, vocab_size = tiny_vocab(tokenizer, SPECIAL_TOKENS)
    config = Config(**_text_config(ids, vocab_size, moe))
    config.architectures = [Model.__name__]
    torch.manual_seed(seed)
    model = Model(config).eval()
    model.save_pretrained(str(out_dir), safe_serialization=True)
    write_mtp(out_dir, model.state_dict(), config.layer_types, seed)
    save_fast_tokenizer(
        tokenizer,
        out_dir,
        bos="<|endoftext|>",
        eos="<|im_end|>",
        pad="<|endoftext|>",
        chat_template=CHAT_TEMPLATE,
    )


def write_mtp(out_dir: Path, state: dict, layer_types: list[str], seed: int) -> None:
    """Random `mtp.*` tensors (one multi-token-prediction layer) in mtp.safetensors, as the
    released checkpoints carry them and transformers ignores them: `fc` [H, 2H] projecting
    the normed next-token embedding and hidden state concatenated, their two norms
    (`pre_fc_norm_embedding`, `pre_fc_norm_hidden`), one decoder layer laid out as the
    model's own full-attention layer (`mtp.layers.0.*`: gated attention, then its MLP or
    experts) and the final `norm`; the LM head is the model's, shared."""
    import torch
    from safetensors.torch import save_file

    full = layer_types.index("full_attention")
    prefix = f"model.layers.{full}."
    generator = torch.Generator().manual_seed(seed + 1)

    def like(value: torch.Tensor) -> torch.Tensor:
        return (torch.randn(value.shape, generator=generator) * 0.05).to(value.dtype)

    tensors = {
        "mtp.layers.0." + name[len(prefix) :]: like(value)
        for name, value in state.items()
        if name.startswith(prefix)
    }
    embed = state["model.embed_tokens.weight"]
    hidden = embed.shape[1]
    tensors["mtp.fc.weight"] = like(embed.new_empty(hidden, 2 * hidden))
    for norm in ("pre_fc_norm_embedding", "pre_fc_norm_hidden", "norm"):
        tensors[f"mtp.{norm}.weight"] = like(embed.new_empty(hidden))
    save_file(tensors, str(out_dir / "mtp.safetensors"), metadata={"format": "pt"})


def build_vl(out_dir: Path, seed: int = 0) -> None:
    """Write a tiny Qwen3_5ForConditionalGeneration: config, random weights, tokenizer,
    image processor config (Qwen3-VL's tiny one)."""
    _build_vl(out_dir, seed, moe=False)


def build_vl_moe(out_dir: Path, seed: int = 0) -> None:
    """The same with Qwen3.5-MoE's language model (Qwen3_5MoeForConditionalGeneration)."""
    _build_vl(out_dir, seed, moe=True)


def _build_vl(out_dir: Path, seed: int, moe: bool) -> None:
    from iris.models.qwen3_vl.tiny import PREPROCESSOR, _vision_config

    if moe:
        from transformers import Qwen3_5MoeConfig as Config
        from transformers import Qwen3_5MoeForConditionalGeneration as Model
    else:
        from transformers import Qwen3_5Config as Config
        from transformers import Qwen3_5ForConditionalGeneration as Model

    tokenizer = build_tokenizer(VL_SPECIAL_TOKENS)
    ids, vocab_size = tiny_vocab(tokenizer, VL_SPECIAL_TOKENS)
    vision = _vision_config()
    del vision["deepstack_visual_indexes"]  # Qwen3.5's tower has none
    save_tiny_qwen_vl(
        out_dir, Model, Config, tokenizer, ids, seed, VL_CHAT_TEMPLATE, PREPROCESSOR,
        text_config=_text_config(ids, vocab_size, moe) | {"rope_parameters": VL_ROPE},
        vision_config=vision,
    )  # fmt: skip
