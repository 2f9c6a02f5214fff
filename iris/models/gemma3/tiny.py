"""Build a tiny random Gemma 3 VLM (Gemma3ForConditionalGeneration) for tests and local runs:
a small SigLIP tower, the multimodal projector pooling to a few tokens per image, Gemma 3's
text model with a sliding and a full layer, and a tokenizer with the processor's tokens."""

from __future__ import annotations

from pathlib import Path

from iris.models.gemma3.adapter import BOI_TOKEN, EOI_TOKEN, IMAGE_TOKEN
from iris.models.text_tiny import INITIALIZER_RANGE
from iris.models.tokenizer_build import TINY_TEXT_SHAPE, build_tokenizer, tiny_vocab

SPECIAL_TOKENS = [
    "<pad>",
    "<bos>",
    "<eos>",
    "<start_of_turn>",
    "<end_of_turn>",
    BOI_TOKEN,
    EOI_TOKEN,
    IMAGE_TOKEN,
]

# Gemma's turn format: "<start_of_turn>user\n...<end_of_turn>\n", the assistant's role is
# "model", a system message joins the first user turn, an image part is <start_of_image>.
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
    "{% if part['type'] == 'image' %}<start_of_image>"
    "{% elif part['type'] == 'text' %}{{ part['text'] | trim }}{% endif %}"
    "{% endfor %}{% endif %}<end_of_turn>\n{% endfor %}"
    "{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}"
)

PICTURE = 64  # the tower's input side
PATCH = 8
TOKENS_PER_IMAGE = 16  # (64 / 8)^2 = 64 patches, average-pooled 2 x 2
SLIDING_WINDOW = 12  # shorter than an image span: a sliding layer cuts into one
PREPROCESSOR = {
    "size": {"height": PICTURE, "width": PICTURE},
    "do_pan_and_scan": False,
    "pan_and_scan_min_crop_size": 32,
    "pan_and_scan_max_num_crops": 3,
    "pan_and_scan_min_ratio_to_activate": 1.2,
    "image_mean": [0.5, 0.5, 0.5],
    "image_std": [0.5, 0.5, 0.5],
}


def build(out_dir: Path, seed: int = 0, pan_and_scan: bool = False) -> None:
    """Write config, random weights, tokenizer and processor configs into `out_dir`."""
    import torch
    from transformers import Gemma3Config, Gemma3ForConditionalGeneration

    tokenizer = build_tokenizer(SPECIAL_TOKENS)
    ids, vocab_size = tiny_vocab(tokenizer, SPECIAL_TOKENS)
    text_config = {
        "model_type": "gemma3_text",
        "vocab_size": vocab_size,
        **TINY_TEXT_SHAPE,
        "head_dim": 16,
        "query_pre_attn_scalar": 24,
        "initializer_range": INITIALIZER_RANGE,
        "sliding_window": SLIDING_WINDOW,
        "layer_types": ["sliding_attention", "full_attention"],
        "rope_parameters": {
            "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6},
            "sliding_attention": {"rope_type": "default", "rope_theta": 1e4},
        },
        "bos_token_id": ids["<bos>"],
        "eos_token_id": ids["<end_of_turn>"],
        "pad_token_id": ids["<pad>"],
        "tie_word_embeddings": False,
    }
    vision_config = {
        "model_type": "siglip_vision_model",
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "image_size": PICTURE,
        "patch_size": PATCH,
    }
    config = Gemma3Config(
        text_config=text_config,
        vision_config=vision_config,
        mm_tokens_per_image=TOKENS_PER_IMAGE,
        boi_token_index=ids[BOI_TOKEN],
        eoi_token_index=ids[EOI_TOKEN],
        image_token_index=ids[IMAGE_TOKEN],
        initializer_range=INITIALIZER_RANGE,
        tie_word_embeddings=False,
    )
    config.architectures = ["Gemma3ForConditionalGeneration"]
    torch.manual_seed(seed)
    model = Gemma3ForConditionalGeneration(config).eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            # Perturbed norms, so a norm applied wrongly shows; a non-zero projection.
            if name.endswith("norm.weight") or name.endswith("mm_input_projection_weight"):
                param.add_(torch.randn_like(param) * 0.2)
    model.generation_config.eos_token_id = ids["<end_of_turn>"]
    model.save_pretrained(str(out_dir), safe_serialization=True)
    fast = _save_tokenizer(tokenizer, out_dir)
    save_processor(out_dir, fast, {**PREPROCESSOR, "do_pan_and_scan": pan_and_scan})


def _save_tokenizer(tokenizer, out_dir: Path):
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
        },
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(str(out_dir))
    return fast


def save_processor(out_dir: Path, tokenizer, preprocessor: dict) -> None:
    """Save Gemma 3's image processor + processor config beside the model."""
    from transformers import Gemma3Processor
    from transformers.models.gemma3.image_processing_pil_gemma3 import Gemma3ImageProcessorPil

    processor = Gemma3Processor(
        Gemma3ImageProcessorPil(**preprocessor),
        tokenizer,
        chat_template=CHAT_TEMPLATE,
        image_seq_length=TOKENS_PER_IMAGE,
    )
    processor.save_pretrained(str(out_dir))
    processor.image_processor.save_pretrained(str(out_dir))
