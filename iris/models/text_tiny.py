"""Tiny random checkpoints of the plain language-model families (no vision side):
Qwen3, Qwen3-MoE, Qwen2-MoE, Gemma 3's and Gemma 4's text models and Mistral, built by
transformers from a small config and saved with `save_pretrained`, with a built-in ChatML tokenizer.

`build(arch, out_dir, **overrides)`: `overrides` replace config keys (the engine tests use
them for small sliding windows and router options). Norm weights are perturbed from their
initial value, so a norm that is applied wrongly ((1 + w) against w, or not at all) shows.
"""

from __future__ import annotations

from pathlib import Path

from iris.models.tokenizer_build import (
    TINY_TEXT_SHAPE,
    build_tokenizer,
    save_fast_tokenizer,
    tiny_vocab,
)

TEXT_ARCHS = (
    "qwen3", "qwen3_moe", "qwen2_moe", "gemma3_text", "gemma4_text", "gemma4_text_ple",
    "gemma4_text_moe", "mistral",
)  # fmt: skip
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{{ message['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
# Larger than HF's default 0.02, so logits are peaked and greedy output varies.
INITIALIZER_RANGE = 0.15
_MOE = {"num_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 32}


def _family_config(arch: str) -> tuple[str, dict]:
    """(transformers class stem, family keys) for `arch`."""
    if arch == "qwen3":
        return "Qwen3", {"head_dim": 16}
    if arch == "qwen3_moe":
        return "Qwen3Moe", {"head_dim": 16, **_MOE, "norm_topk_prob": True}
    if arch == "qwen2_moe":
        return "Qwen2Moe", {**_MOE, "shared_expert_intermediate_size": 96}
    if arch == "gemma3_text":
        return "Gemma3", {
            "head_dim": 16,
            "query_pre_attn_scalar": 24,
            # Tied, a tiny random Gemma repeats its last token (the √hidden-scaled embedding
            # dominates the residual); untied, greedy output varies.
            "tie_word_embeddings": False,
            "sliding_window": 16,
            "layer_types": ["sliding_attention", "full_attention"],
            "rope_parameters": {
                "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6},
                "sliding_attention": {"rope_type": "default", "rope_theta": 1e4},
            },
        }
    if arch == "gemma4_text":
        # Part 1's model: no per-layer embeddings; full layers wider than sliding ones (head
        # dim 32, 1 KV head against 16 and 2), keys equal values on them, the last two layers
        # reusing KV with double-wide MLPs, and soft-capped logits.
        return "Gemma4", {
            "head_dim": 16,
            "global_head_dim": 32,
            "num_global_key_value_heads": 1,
            "attention_k_eq_v": True,
            "hidden_size_per_layer_input": 0,
            # Untied for the reason Gemma 3's is (tied, the tiny model repeats a token).
            "tie_word_embeddings": False,
            "num_hidden_layers": 6,
            "num_kv_shared_layers": 2,
            "use_double_wide_mlp": True,
            "final_logit_softcapping": 30.0,
            "sliding_window": 16,
            "layer_types": ["sliding_attention", "full_attention"] * 3,
            "rope_parameters": {
                "full_attention": {
                    "rope_type": "proportional", "partial_rotary_factor": 0.25, "rope_theta": 1e6,
                },
                "sliding_attention": {"rope_type": "default", "rope_theta": 1e4},
            },
        }  # fmt: skip
    if arch == "gemma4_text_ple":
        # Part 1's model with per-layer embeddings, as the E models have them beside their
        # KV-shared layers: 16-wide slices of a table as long as the vocabulary.
        _, keys = _family_config("gemma4_text")
        return "Gemma4", {**keys, "hidden_size_per_layer_input": 16}
    if arch == "gemma4_text_moe":
        # The 26B-A4B's shape in small: the MoE block beside every dense MLP, one global KV
        # head with keys equal values, no KV sharing nor per-layer embeddings.
        _, keys = _family_config("gemma4_text")
        return "Gemma4", {
            **keys,
            "num_hidden_layers": 4,
            "layer_types": ["sliding_attention", "full_attention"] * 2,
            "num_kv_shared_layers": 0,
            "use_double_wide_mlp": False,
            "enable_moe_block": True,
            "num_experts": 8,
            "top_k_experts": 2,
            "moe_intermediate_size": 32,
        }
    if arch == "mistral":
        # Every layer slides once `sliding_window` is set (the engine tests set a small one).
        return "Mistral", {"head_dim": 16, "sliding_window": 32}
    raise ValueError(f"unknown text arch {arch!r} (choose from: {', '.join(TEXT_ARCHS)})")


def build(arch: str, out_dir: Path, seed: int = 0, **overrides) -> None:
    """Write tiny checkpoint `arch` (config, random weights, tokenizer) into `out_dir`."""
    import torch
    import transformers as tf

    stem, family = _family_config(arch)
    text_config = stem in ("Gemma3", "Gemma4")
    config_cls = getattr(tf, f"{stem}TextConfig" if text_config else f"{stem}Config")
    model_cls = getattr(tf, f"{stem}ForCausalLM")
    tokenizer = build_tokenizer(SPECIAL_TOKENS)
    ids, vocab_size = tiny_vocab(tokenizer, SPECIAL_TOKENS)
    keys = {
        "vocab_size": vocab_size,
        **TINY_TEXT_SHAPE,
        "initializer_range": INITIALIZER_RANGE,
        "bos_token_id": ids["<|endoftext|>"],
        "eos_token_id": ids["<|im_end|>"],
        "pad_token_id": ids["<|endoftext|>"],
        **family,
        **overrides,
    }
    if arch == "gemma4_text_ple":
        keys.setdefault("vocab_size_per_layer_input", vocab_size)
    config = config_cls(**keys)
    config.architectures = [model_cls.__name__]
    torch.manual_seed(seed)
    model = model_cls(config).eval()
    with torch.no_grad():
        # Gemma 4's layer_scalar (a stored buffer) and its router's scales are perturbed too,
        # so each shows if ignored.
        for name, param in [*model.named_parameters(), *model.named_buffers()]:
            if name.endswith(("norm.weight", "layer_scalar", "router.scale", "per_expert_scale")):
                param.add_(torch.randn_like(param) * 0.2)
    model.generation_config.eos_token_id = ids["<|im_end|>"]
    model.save_pretrained(str(out_dir), safe_serialization=True)
    save_fast_tokenizer(
        tokenizer,
        out_dir,
        bos="<|endoftext|>",
        eos="<|im_end|>",
        pad="<|endoftext|>",
        chat_template=CHAT_TEMPLATE,
    )
