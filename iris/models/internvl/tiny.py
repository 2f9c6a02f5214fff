"""Build a tiny random InternVL3.5 checkpoint (the transformers "-HF" layout, a Qwen3 or
Qwen3-MoE language model) for tests and local runs."""

from __future__ import annotations

from pathlib import Path

from iris.models.tokenizer_build import (
    TINY_TEXT_SHAPE,
    build_tokenizer,
    save_fast_tokenizer,
    tiny_vocab,
)

# InternVL's tokenizer attributes, as InternVLProcessor reads them.
IMAGE_TOKENS = {
    "start_image_token": "<img>",
    "end_image_token": "</img>",
    "context_image_token": "<IMG_CONTEXT>",
    "video_token": "<video>",
}
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", *IMAGE_TOKENS.values()]
THINK_TOKENS = ["<think>", "</think>"]  # added, not special, as in Qwen3's tokenizer

# Qwen3's ChatML with its thinking switch (a closed, empty thought when enable_thinking is
# false); an image part is InternVL's context token, which the processor (and Iris's
# adapter) expands into <img> + tiles + </img>.
CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for part in message['content'] %}"
    "{% if part['type'] == 'image' %}<IMG_CONTEXT>\n"
    "{% elif part['type'] == 'text' %}{{ part['text'] }}{% endif %}"
    "{% endfor %}{% endif %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n"
    "{% if enable_thinking is defined and enable_thinking is false %}"
    "<think>\n\n</think>\n\n{% endif %}{% endif %}"
)

TILE = 64  # the tower's input side: every tile and the thumbnail are TILE x TILE
PATCH = 8
DOWNSAMPLE = 0.5
IMAGE_SEQ_LEN = int((TILE // PATCH) ** 2 * DOWNSAMPLE**2)
PREPROCESSOR = {
    "size": {"height": TILE, "width": TILE},
    # As the published -HF checkpoints: off here, turned on by InternVLProcessor.
    "crop_to_patches": False,
    "min_patches": 1,
    "max_patches": 12,
}
INITIALIZER_RANGE = 0.15
_MOE = {"num_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 32}


def build(out_dir: Path, seed: int = 0, text_model: str = "qwen3") -> None:
    """Write config, random weights, tokenizer and processor configs into `out_dir`;
    `text_model` is "qwen3" or "qwen3_moe"."""
    import torch
    from transformers import InternVLConfig, InternVLForConditionalGeneration

    tokenizer = build_tokenizer(SPECIAL_TOKENS)
    tokenizer.add_tokens(THINK_TOKENS)
    ids, vocab_size = tiny_vocab(tokenizer, SPECIAL_TOKENS)
    text_config = {
        "model_type": text_model,
        "vocab_size": vocab_size,
        **TINY_TEXT_SHAPE,
        "head_dim": 16,
        "initializer_range": INITIALIZER_RANGE,
        "bos_token_id": ids["<|endoftext|>"],
        "eos_token_id": ids["<|im_end|>"],
        "pad_token_id": ids["<|endoftext|>"],
        **(_MOE | {"norm_topk_prob": True} if text_model == "qwen3_moe" else {}),
    }
    vision_config = {
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "image_size": TILE,
        "patch_size": PATCH,
        "initializer_range": INITIALIZER_RANGE,
    }
    config = InternVLConfig(
        text_config=text_config,
        vision_config=vision_config,
        image_token_id=ids["<IMG_CONTEXT>"],
        image_seq_length=IMAGE_SEQ_LEN,
        downsample_ratio=DOWNSAMPLE,
        tie_word_embeddings=False,
    )
    config.architectures = ["InternVLForConditionalGeneration"]
    torch.manual_seed(seed)
    model = InternVLForConditionalGeneration(config).eval()
    _perturb_norms(model)
    model.generation_config.eos_token_id = ids["<|im_end|>"]
    model.save_pretrained(str(out_dir), safe_serialization=True)
    fast = save_fast_tokenizer(
        tokenizer,
        out_dir,
        bos="<|endoftext|>",
        eos="<|im_end|>",
        pad="<|endoftext|>",
        chat_template=CHAT_TEMPLATE,
        extra_special=IMAGE_TOKENS,
    )
    _save_processor(out_dir, fast)


def _perturb_norms(model) -> None:
    # Norm weights away from their initial value, so a norm applied wrongly shows.
    import torch

    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("norm.weight"):
                param.add_(torch.randn_like(param) * 0.2)


def image_only_processor_class():
    """InternVLProcessor, built without a video processor: transformers checks each part's
    class, and the video processor's base class is missing where torchvision does not
    import (CPU torch 2.13). Only that check is skipped; the processor's own code runs."""
    from transformers import InternVLProcessor

    class ImageOnlyInternVLProcessor(InternVLProcessor):
        def check_argument_for_proper_class(self, argument_name, argument):
            if argument_name == "video_processor" and argument is None:
                return None
            return super().check_argument_for_proper_class(argument_name, argument)

    return ImageOnlyInternVLProcessor


def _save_processor(out_dir: Path, tokenizer) -> None:
    import json

    from transformers.models.got_ocr2.image_processing_pil_got_ocr2 import (
        GotOcr2ImageProcessorPil,
    )

    GotOcr2ImageProcessorPil(**PREPROCESSOR).save_pretrained(str(out_dir))
    # The processor's own settings, as the published checkpoints carry them (a processor
    # without its video part cannot save itself).
    settings = {"image_seq_length": IMAGE_SEQ_LEN, "processor_class": "InternVLProcessor"}
    (out_dir / "processor_config.json").write_text(json.dumps(settings, indent=2) + "\n")


def load_processor(model_dir: Path):
    """The checkpoint's InternVLProcessor (without its video part)."""
    import json

    from transformers import PreTrainedTokenizerFast
    from transformers.models.got_ocr2.image_processing_pil_got_ocr2 import (
        GotOcr2ImageProcessorPil,
    )

    settings = json.loads((Path(model_dir) / "processor_config.json").read_text())
    tokenizer = PreTrainedTokenizerFast.from_pretrained(str(model_dir))
    return image_only_processor_class()(
        image_processor=GotOcr2ImageProcessorPil.from_pretrained(str(model_dir)),
        tokenizer=tokenizer,
        image_seq_length=settings["image_seq_length"],
        chat_template=tokenizer.chat_template,
    )
