"""Build a tiny random Gemma 4 VLM (Gemma4ForConditionalGeneration) for tests and local runs:
a small vision tower (4-pixel patches, so the smallest budget, 70 soft tokens, is a
~100 × 100 image), part 1's text model and a tokenizer with the processor's tokens.

- `gemma4`: the dense text model with image spans attending both ways on sliding layers
  (`use_bidirectional_attention` "vision"), clipped linears and standardisation in the tower.
- `gemma4_moe`: the same with the MoE block.
- `gemma4_e`: an E model's shape: per-layer embeddings, KV-shared layers, causal image
  spans, and an audio config (its tower is in the checkpoint; Iris never loads it).
"""

from __future__ import annotations

import json
from pathlib import Path

from iris.models.gemma4.adapter import AUDIO_TOKEN, BOI_TOKEN, EOI_TOKEN, IMAGE_TOKEN, VIDEO_TOKEN
from iris.models.text_tiny import INITIALIZER_RANGE, _family_config
from iris.models.tokenizer_build import TINY_TEXT_SHAPE, build_tokenizer, tiny_vocab

BOA_TOKEN, EOA_TOKEN = "<|audio>", "<audio|>"
SPECIAL_TOKENS = [
    "<pad>", "<bos>", "<eos>", "<start_of_turn>", "<end_of_turn>",
    BOI_TOKEN, EOI_TOKEN, IMAGE_TOKEN, VIDEO_TOKEN, BOA_TOKEN, EOA_TOKEN, AUDIO_TOKEN,
]  # fmt: skip

# Gemma's turn format, as gemma3/tiny.py writes it; an image part is <|image|>, a video
# part <|video|>.
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% if messages and messages[0]['role'] in ('system', 'developer') %}"
    "{% set first = messages[0]['content'] if messages[0]['content'] is string "
    "else messages[0]['content'][0]['text'] %}"
    "{% set prefix = first + '\n\n' %}{% set turns = messages[1:] %}"
    "{% else %}{% set prefix = '' %}{% set turns = messages %}{% endif %}"
    "{% for message in turns %}"
    "{% set role = 'model' if message['role'] == 'assistant' else message['role'] %}"
    "<start_of_turn>{{ role }}\n{{ prefix if loop.first else '' }}"
    "{% if message['content'] is string %}{{ message['content'] | trim }}"
    "{% else %}{% for part in message['content'] %}"
    "{% if part['type'] == 'image' %}<|image|>"
    "{% elif part['type'] == 'video' %}<|video|>"
    "{% elif part['type'] == 'text' %}{{ part['text'] | trim }}{% endif %}"
    "{% endfor %}{% endif %}<end_of_turn>\n{% endfor %}"
    "{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}"
)

PATCH = 4
MAX_SOFT_TOKENS = 70  # the processor's smallest budget: 630 patches of 4 px
PREPROCESSOR = {"patch_size": PATCH, "max_soft_tokens": MAX_SOFT_TOKENS, "pooling_kernel_size": 3}
VISION_CONFIG = {
    "model_type": "gemma4_vision",
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "patch_size": PATCH,
    "pooling_kernel_size": 3,
    "position_embedding_size": 256,  # > the longest side in patches (70 blocks of 3)
}
AUDIO_CONFIG = {
    "model_type": "gemma4_audio",
    "hidden_size": 32,
    "num_hidden_layers": 1,
    "num_attention_heads": 2,
    "subsampling_conv_channels": [8, 4],
    "output_proj_dims": 32,
}


def _text_config(arch: str) -> dict:
    text_arch = {"gemma4": "gemma4_text", "gemma4_moe": "gemma4_text_moe"}.get(arch)
    _, keys = _family_config(text_arch or "gemma4_text_ple")
    keys = {**TINY_TEXT_SHAPE, **keys, "model_type": "gemma4_text"}
    if arch != "gemma4_e":
        keys["use_bidirectional_attention"] = "vision"
    return keys


def build(out_dir: Path, arch: str = "gemma4", seed: int = 0) -> None:
    """Write config, random weights, tokenizer and processor configs into `out_dir`."""
    import torch
    from transformers import Gemma4Config, Gemma4ForConditionalGeneration

    tokenizer = build_tokenizer(SPECIAL_TOKENS)
    ids, vocab_size = tiny_vocab(tokenizer, SPECIAL_TOKENS)
    text_config = {
        **_text_config(arch),
        "vocab_size": vocab_size,
        "initializer_range": INITIALIZER_RANGE,
        "bos_token_id": ids["<bos>"],
        "eos_token_id": ids["<end_of_turn>"],
        "pad_token_id": ids["<pad>"],
    }
    if text_config.get("hidden_size_per_layer_input"):
        text_config["vocab_size_per_layer_input"] = vocab_size
    vision = {**VISION_CONFIG, "use_clipped_linears": arch != "gemma4_e"}
    vision["standardize"] = arch != "gemma4_e"
    config = Gemma4Config(
        text_config=text_config,
        vision_config=vision,
        audio_config=AUDIO_CONFIG if arch == "gemma4_e" else None,
        boi_token_id=ids[BOI_TOKEN],
        eoi_token_id=ids[EOI_TOKEN],
        image_token_id=ids[IMAGE_TOKEN],
        video_token_id=ids[VIDEO_TOKEN],
        audio_token_id=ids[AUDIO_TOKEN],
        boa_token_id=ids[BOA_TOKEN],
        eoa_token_id=ids[EOA_TOKEN],
        initializer_range=INITIALIZER_RANGE,
        tie_word_embeddings=False,
    )
    config.architectures = ["Gemma4ForConditionalGeneration"]
    torch.manual_seed(seed)
    model = Gemma4ForConditionalGeneration(config).eval()
    _perturb(model)
    model.generation_config.eos_token_id = ids["<end_of_turn>"]
    model.save_pretrained(str(out_dir), safe_serialization=True)
    _save_tokenizer(tokenizer, out_dir)
    _save_processors(out_dir)


def _perturb(model) -> None:
    """Norms and scalars off their initial values, finite clipping bounds that bite and a
    standardisation that changes the rows, so each shows if applied wrongly or not at all."""
    import torch

    with torch.no_grad():
        for name, tensor in [*model.named_parameters(), *model.named_buffers()]:
            if name.endswith(("norm.weight", "layer_scalar", "router.scale", "per_expert_scale")):
                tensor.add_(torch.randn_like(tensor) * 0.2)
            elif name.endswith(("input_min", "output_min")):
                tensor.fill_(-2.0)
            elif name.endswith(("input_max", "output_max")):
                tensor.fill_(2.0)
            elif name.endswith("std_bias"):
                tensor.copy_(torch.randn_like(tensor) * 0.1)
            elif name.endswith("std_scale"):
                tensor.copy_(1.0 + torch.rand_like(tensor))


def _save_tokenizer(tokenizer, out_dir: Path) -> None:
    from transformers import PreTrainedTokenizerFast

    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        bos_token="<bos>",
        eos_token="<eos>",
        pad_token="<pad>",
        extra_special_tokens={
            "boi_token": BOI_TOKEN,
            "eoi_token": EOI_TOKEN,
            "image_token": IMAGE_TOKEN,
            "boa_token": BOA_TOKEN,
            "eoa_token": EOA_TOKEN,
            "audio_token": AUDIO_TOKEN,
        },
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(str(out_dir))


def _save_processors(out_dir: Path) -> None:
    """The image processor's config; the video processor's is written as JSON (its class
    imports torchvision, which does not run here)."""
    from transformers.models.gemma4.image_processing_pil_gemma4 import Gemma4ImageProcessorPil

    Gemma4ImageProcessorPil(**PREPROCESSOR).save_pretrained(str(out_dir))
    video = {"video_processor_type": "Gemma4VideoProcessor", "num_frames": 32, **PREPROCESSOR}
    (out_dir / "video_preprocessor_config.json").write_text(json.dumps(video, indent=2) + "\n")
