"""Build a tiny random Idefics3 (SmolVLM layout) checkpoint for tests and local runs."""

from __future__ import annotations

from pathlib import Path

from iris.models.tokenizer_build import (
    TINY_TEXT_SHAPE,
    build_tokenizer,
    save_fast_tokenizer,
    tiny_vocab,
)

ROW_COL_TOKENS = [f"<row_{row}_col_{col}>" for row in range(1, 7) for col in range(1, 7)]
SPECIAL_TOKENS = [
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<end_of_utterance>",
    "<fake_token_around_image>",
    "<image>",
    "<global-img>",
    *ROW_COL_TOKENS,
]

# SmolVLM's conversation format ("User: ...<end_of_utterance>\nAssistant:"); an image part
# becomes one <image> that the adapter expands into tiles.
CHAT_TEMPLATE = (
    "<|im_start|>{% for message in messages %}{{ message['role'] | capitalize }}: "
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for part in message['content'] %}"
    "{% if part['type'] == 'image' %}<image>"
    "{% elif part['type'] == 'text' %}{{ part['text'] }}{% endif %}"
    "{% endfor %}{% endif %}<end_of_utterance>\n{% endfor %}"
    "{% if add_generation_prompt %}Assistant:{% endif %}"
)

TILE = 64  # vision tower input side: every tile and the global image are TILE x TILE
PATCH = 8
SCALE_FACTOR = 2
IMAGE_SEQ_LEN = (TILE // PATCH) ** 2 // SCALE_FACTOR**2
PREPROCESSOR = {
    "size": {"longest_edge": 4 * TILE},
    "max_image_size": {"longest_edge": TILE},
    "do_image_splitting": True,
}


def build(out_dir: Path, seed: int = 0) -> None:
    """Write config, random weights, tokenizer and processor configs into `out_dir`."""
    import torch
    from transformers import Idefics3Config, Idefics3ForConditionalGeneration

    tokenizer = build_tokenizer(SPECIAL_TOKENS)
    ids, vocab_size = tiny_vocab(tokenizer, SPECIAL_TOKENS)
    text_config = {
        "model_type": "llama",
        "vocab_size": vocab_size,
        **TINY_TEXT_SHAPE,
        "rms_norm_eps": 1e-5,
        "bos_token_id": ids["<|im_start|>"],
        "eos_token_id": ids["<end_of_utterance>"],
        "pad_token_id": ids["<|endoftext|>"],
        "tie_word_embeddings": False,
    }
    vision_config = {
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "image_size": TILE,
        "patch_size": PATCH,
    }
    config = Idefics3Config(
        text_config=text_config,
        vision_config=vision_config,
        image_token_id=ids["<image>"],
        scale_factor=SCALE_FACTOR,
        tie_word_embeddings=False,
    )
    config.architectures = ["Idefics3ForConditionalGeneration"]
    torch.manual_seed(seed)
    model = Idefics3ForConditionalGeneration(config).eval()
    model.save_pretrained(str(out_dir), safe_serialization=True)
    fast = save_fast_tokenizer(
        tokenizer,
        out_dir,
        bos="<|im_start|>",
        eos="<end_of_utterance>",
        pad="<|endoftext|>",
        chat_template=CHAT_TEMPLATE,
    )
    save_processor(out_dir, fast, CHAT_TEMPLATE, PREPROCESSOR, IMAGE_SEQ_LEN)


def save_processor(out_dir: Path, tokenizer, chat_template: str, preprocessor: dict, seq_len: int):
    """Save Idefics3's image processor + processor config (and tokenizer) beside the model."""
    from transformers import Idefics3Processor
    from transformers.models.idefics3.image_processing_pil_idefics3 import (
        Idefics3ImageProcessorPil,
    )

    processor = Idefics3Processor(
        Idefics3ImageProcessorPil(**preprocessor),
        tokenizer,
        image_seq_len=seq_len,
        chat_template=chat_template,
    )
    processor.save_pretrained(str(out_dir))
    # transformers 5 nests the image processor in processor_config.json; the standalone
    # preprocessor_config.json is what older loaders and the fingerprint read.
    processor.image_processor.save_pretrained(str(out_dir))
