"""Tiny random checkpoints (HF layout) for the engine tests, built once and kept on disk.

Text-only Llama / Qwen2 LMs, and VLM layouts (Idefics3, Qwen2-VL) whose language model sits
under a prefix, each with a small byte-level BPE tokenizer and a chat template.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

CACHE_ROOT = Path(__file__).resolve().parents[2] / ".cache" / "llm_svc_tests"
VERSION = "v2"
SPECIALS = ["<|end|>", "<|user|>", "<|assistant|>", "<|system|>", "<image>", "<pad>"]
CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}<|end|>{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
_CORPUS = (
    "The quick brown fox jumps over the lazy dog. The capital of France is Paris. "
    "A cat sat on the mat; the dog ran to the park and back again. 0123456789 + - = ? ! "
    "hello world, how are you today? I am fine, thank you very much. Ünïcödé ✓ 日本語 "
) * 8
VOCAB = 384
TEXT = dict(
    vocab_size=VOCAB,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=1024,
    # Larger than the default 0.02 so logits are peaked and greedy ties cannot occur.
    initializer_range=0.2,
)


def qwen3_5_text(text: dict) -> dict:
    """A tiny hybrid Qwen3.5: linear, linear, full, linear (a full layer mid-stack and
    linear layers on both sides), head_dim 16 so partial rotary turns 4 dims."""
    return dict(
        text,
        num_hidden_layers=4,
        layer_types=["linear_attention", "linear_attention", "full_attention", "linear_attention"],
        head_dim=16,
        linear_num_key_heads=2,
        linear_num_value_heads=4,
        linear_key_head_dim=16,
        linear_value_head_dim=8,
        linear_conv_kernel_dim=4,
        tie_word_embeddings=False,
    )


def _tokenizer():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB - len(SPECIALS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator([_CORPUS], trainer=trainer)
    tok.add_special_tokens(SPECIALS)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token="<|end|>", pad_token="<pad>", bos_token="<|system|>"
    )
    fast.chat_template = CHAT_TEMPLATE
    return fast


def _build(kind: str, out: Path) -> None:
    import torch
    import transformers as tf

    torch.manual_seed(0)
    tokenizer = _tokenizer()
    eos = tokenizer.convert_tokens_to_ids("<|end|>")
    image = tokenizer.convert_tokens_to_ids("<image>")
    text = dict(TEXT, eos_token_id=eos, pad_token_id=tokenizer.pad_token_id)
    if kind == "llama":
        model = tf.LlamaForCausalLM(tf.LlamaConfig(**text, tie_word_embeddings=True))
    elif kind == "qwen2":
        model = tf.Qwen2ForCausalLM(tf.Qwen2Config(**text, tie_word_embeddings=False))
    elif kind == "qwen3_5":
        model = tf.Qwen3_5ForCausalLM(tf.Qwen3_5TextConfig(**qwen3_5_text(text)))
    elif kind == "idefics3":
        vision = dict(
            hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
            image_size=32, patch_size=8,
        )  # fmt: skip
        config = tf.Idefics3Config(
            text_config=dict(text, model_type="llama"), vision_config=vision,
            image_token_id=image, scale_factor=2, tie_word_embeddings=False,
        )  # fmt: skip
        model = tf.Idefics3ForConditionalGeneration(config)
    elif kind == "qwen2_vl":
        vision = dict(depth=1, embed_dim=32, hidden_size=64, num_heads=2, mlp_ratio=2)
        rope = {"rope_type": "default", "type": "mrope", "mrope_section": [2, 3, 3]}
        config = tf.Qwen2VLConfig(
            text_config=dict(text, rope_scaling=rope, rope_theta=10000.0),
            vision_config=vision, image_token_id=image, vision_start_token_id=image,
            vision_end_token_id=image, video_token_id=image, tie_word_embeddings=False,
        )  # fmt: skip
        model = tf.Qwen2VLForConditionalGeneration(config)
    else:
        raise ValueError(kind)
    model.generation_config.eos_token_id = eos
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)


def tiny_checkpoint(kind: str) -> Path:
    """The directory of tiny checkpoint `kind` (llama, qwen2, qwen3_5, idefics3, qwen2_vl)."""
    target = CACHE_ROOT / f"{kind}-{VERSION}"
    if (target / "config.json").is_file():
        return target
    CACHE_ROOT.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=CACHE_ROOT, prefix=f".{kind}-"))
    try:
        _build(kind, staging)
        os.replace(staging, target)  # atomic: a concurrent builder's copy is as good
    except OSError:
        if not (target / "config.json").is_file():
            raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


def mtp_checkpoint(arch: str) -> Path:
    """`iris models make-tiny --arch <arch>`'s checkpoint (qwen3_5 or qwen3_5_moe), which
    carries one random MTP layer (mtp.safetensors); built once."""
    from iris.models.build import build_atomically
    from iris.models.qwen3_5 import tiny

    builder = {"qwen3_5": tiny.build, "qwen3_5_moe": tiny.build_moe}[arch]
    return build_atomically(CACHE_ROOT / f"make-tiny-{arch}-m1", builder)
