"""Build a tiny random Qwen2-VL checkpoint (HF layout) for tests and local runs."""

from __future__ import annotations

import json
from pathlib import Path

from iris.models.tokenizer_build import (
    TINY_TEXT_SHAPE,
    build_tokenizer,
    save_fast_tokenizer,
    tiny_vocab,
)

SPECIAL_TOKENS = [
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|image_pad|>",
    "<|video_pad|>",
]

# ChatML, as Qwen2-VL's own template renders it: an image part becomes the start/pad/end triple.
CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for part in message['content'] %}"
    "{% if part['type'] == 'image' %}<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif part['type'] == 'video' %}<|vision_start|><|video_pad|><|vision_end|>"
    "{% elif part['type'] == 'text' %}{{ part['text'] }}{% endif %}"
    "{% endfor %}{% endif %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

PREPROCESSOR = {
    "min_pixels": 56 * 56,
    # 448 x 448: at most 256 image tokens per image keeps the tests fast.
    "max_pixels": 28 * 28 * 256,
    "patch_size": 14,
    "temporal_patch_size": 2,
    "merge_size": 2,
}


def build(out_dir: Path, seed: int = 0) -> None:
    """Write a tiny Qwen2-VL: config, random weights, tokenizer, preprocessor config."""
    _build(out_dir, seed, qwen2_5=False)


def build_qwen2_5(out_dir: Path, seed: int = 0) -> None:
    """The same, Qwen2.5-VL flavoured (window attention, RMSNorm, gated MLP vision tower)."""
    _build(out_dir, seed, qwen2_5=True)


def _vision_config(qwen2_5: bool) -> dict:
    common = {
        "depth": 2,
        "num_heads": 2,
        "patch_size": PREPROCESSOR["patch_size"],
        "spatial_merge_size": PREPROCESSOR["merge_size"],
        "temporal_patch_size": PREPROCESSOR["temporal_patch_size"],
    }
    if qwen2_5:
        # window 56 px = 2x2 merged tokens, so the tiny images use several windows.
        extra = {
            "hidden_size": 32,
            "intermediate_size": 64,
            "out_hidden_size": 64,
            "window_size": 56,
            "fullatt_block_indexes": [1],
        }
        return common | extra
    return common | {"embed_dim": 32, "hidden_size": 64, "mlp_ratio": 2}


def _build(out_dir: Path, seed: int, qwen2_5: bool) -> None:
    from transformers import (
        Qwen2_5_VLConfig,
        Qwen2_5_VLForConditionalGeneration,
        Qwen2VLConfig,
        Qwen2VLForConditionalGeneration,
    )

    config_cls = Qwen2_5_VLConfig if qwen2_5 else Qwen2VLConfig
    model_cls = Qwen2_5_VLForConditionalGeneration if qwen2_5 else Qwen2VLForConditionalGeneration

    tokenizer = build_tokenizer(SPECIAL_TOKENS)
    ids, vocab_size = tiny_vocab(tokenizer, SPECIAL_TOKENS)
    text_config = {
        "vocab_size": vocab_size,
        **TINY_TEXT_SHAPE,
        # head_dim 16 -> 8 rotary frequencies split over (t, h, w).
        "rope_parameters": {
            "rope_type": "default",
            "rope_theta": 10000.0,
            "mrope_section": [2, 3, 3],
        },
        "bos_token_id": ids["<|endoftext|>"],
        "eos_token_id": ids["<|im_end|>"],
        "pad_token_id": ids["<|endoftext|>"],
    }
    save_tiny_qwen_vl(
        out_dir, model_cls, config_cls, tokenizer, ids, seed, CHAT_TEMPLATE, PREPROCESSOR,
        text_config=text_config, vision_config=_vision_config(qwen2_5),
    )  # fmt: skip


def save_tiny_qwen_vl(
    out_dir: Path,
    model_cls,
    config_cls,
    tokenizer,
    ids: dict,
    seed: int,
    chat_template: str,
    preprocessor: dict,
    **config_parts,
) -> None:
    """What every tiny Qwen VLM writes (Qwen2-VL, Qwen2.5-VL, Qwen3-VL, Qwen3.5): the model
    built from `config_parts` (text and vision configs) and Qwen's vision token ids, with
    weights from `seed`; the fast tokenizer with `chat_template`; the image processor's
    `preprocessor` settings."""
    import torch
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import (
        Qwen2VLImageProcessorPil,
    )

    config = config_cls(
        **config_parts,
        image_token_id=ids["<|image_pad|>"],
        video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"],
        vision_end_token_id=ids["<|vision_end|>"],
        tie_word_embeddings=False,
    )
    config.architectures = [model_cls.__name__]
    torch.manual_seed(seed)
    model = model_cls(config).eval()
    model.save_pretrained(str(out_dir), safe_serialization=True)
    save_fast_tokenizer(
        tokenizer,
        out_dir,
        bos="<|endoftext|>",
        eos="<|im_end|>",
        pad="<|endoftext|>",
        chat_template=chat_template,
    )
    Qwen2VLImageProcessorPil(**preprocessor).save_pretrained(str(out_dir))
    _normalise_preprocessor(out_dir)


def _normalise_preprocessor(out_dir: Path) -> None:
    # Real Qwen2-VL checkpoints name the processor class without the backend suffix; keep the
    # same so AutoImageProcessor picks whichever backend can import.
    path = out_dir / "preprocessor_config.json"
    data = json.loads(path.read_text())
    data["image_processor_type"] = "Qwen2VLImageProcessor"
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
