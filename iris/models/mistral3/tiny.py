"""Build a tiny random Mistral Small 3 checkpoint (Pixtral tower, `mistral` text config)
for tests and local runs."""

from __future__ import annotations

from pathlib import Path

from iris.models.tokenizer_build import (
    TINY_TEXT_SHAPE,
    build_tokenizer,
    save_fast_tokenizer,
    tiny_vocab,
)

SPECIAL_TOKENS = [
    "<unk>",
    "<s>",
    "</s>",
    "[INST]",
    "[/INST]",
    "[IMG]",
    "[IMG_BREAK]",
    "[IMG_END]",
    "[AVAILABLE_TOOLS]",
    "[/AVAILABLE_TOOLS]",
    "[TOOL_CALLS]",
    "[TOOL_RESULTS]",
    "[/TOOL_RESULTS]",
    "[SYSTEM_PROMPT]",
    "[/SYSTEM_PROMPT]",
]

# Mistral's format (the published Mistral Small 3.x templates, tokenizer v7): [INST] user
# [/INST] answer</s>; an image part is one [IMG], which the processor (and Iris's adapter)
# expands into rows broken by [IMG_BREAK]. Tools are listed as JSON right before the last
# user turn in [AVAILABLE_TOOLS]; an assistant's calls are [TOOL_CALLS] and one JSON list of
# {"name", "arguments", "id"}, then </s>; a result is [TOOL_RESULTS]{"content", "call_id"}
# [/TOOL_RESULTS].
CHAT_TEMPLATE = (
    "{%- set ns = namespace(last_user=-1) %}"
    "{%- for message in messages %}{% if message['role'] == 'user' %}"
    "{% set ns.last_user = loop.index0 %}{% endif %}{% endfor %}"
    "<s>{% for message in messages %}"
    "{% if message['role'] == 'system' %}[SYSTEM_PROMPT]{{ message['content'] }}"
    "[/SYSTEM_PROMPT]"
    "{% elif message['role'] == 'user' %}"
    "{% if tools and loop.index0 == ns.last_user %}"
    "[AVAILABLE_TOOLS]{{ tools | tojson }}[/AVAILABLE_TOOLS]{% endif %}[INST]"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for part in message['content'] %}"
    "{% if part['type'] == 'image' %}[IMG]"
    "{% elif part['type'] == 'text' %}{{ part['text'] }}{% endif %}"
    "{% endfor %}{% endif %}[/INST]"
    "{% elif message['role'] == 'assistant' %}"
    "{% if message['tool_calls'] %}[TOOL_CALLS][{% for call in message['tool_calls'] %}"
    "{\"name\": {{ call['function']['name'] | tojson }}, "
    "\"arguments\": {{ call['function']['arguments'] | tojson }}"
    "{% if call['id'] %}, \"id\": {{ call['id'] | tojson }}{% endif %}}"
    "{% if not loop.last %}, {% endif %}{% endfor %}]"
    "{% elif message['content'] %}{{ message['content'] }}{% endif %}</s>"
    "{% elif message['role'] == 'tool' %}"
    "{% if message['content'] is string %}{% set result = message['content'] %}"
    "{% else %}{% set result = message['content'] | map(attribute='text') | join %}{% endif %}"
    '[TOOL_RESULTS]{"content": {{ result | tojson }}'
    "{% if message['tool_call_id'] %}, \"call_id\": {{ message['tool_call_id'] | tojson }}"
    "{% endif %}}[/TOOL_RESULTS]"
    "{% endif %}{% endfor %}"
)

PATCH = 8
MERGE = 2
LONGEST_EDGE = 128
INITIALIZER_RANGE = 0.15


def build(out_dir: Path, seed: int = 0) -> None:
    """Write config, random weights, tokenizer and processor configs into `out_dir`."""
    import torch
    from transformers import Mistral3Config, Mistral3ForConditionalGeneration

    tokenizer = build_tokenizer(SPECIAL_TOKENS)
    ids, vocab_size = tiny_vocab(tokenizer, SPECIAL_TOKENS)
    text_config = {
        "model_type": "mistral",
        "vocab_size": vocab_size,
        **TINY_TEXT_SHAPE,
        "head_dim": 16,
        "sliding_window": None,
        "initializer_range": INITIALIZER_RANGE,
        "bos_token_id": ids["<s>"],
        "eos_token_id": ids["</s>"],
        "pad_token_id": ids["<unk>"],
    }
    vision_config = {
        "model_type": "pixtral",
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "head_dim": 16,
        "image_size": LONGEST_EDGE,
        "patch_size": PATCH,
        "initializer_range": INITIALIZER_RANGE,
    }
    config = Mistral3Config(
        text_config=text_config,
        vision_config=vision_config,
        image_token_index=ids["[IMG]"],
        spatial_merge_size=MERGE,
        vision_feature_layer=-1,
        tie_word_embeddings=False,
    )
    config.architectures = ["Mistral3ForConditionalGeneration"]
    torch.manual_seed(seed)
    model = Mistral3ForConditionalGeneration(config).eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("norm.weight"):
                param.add_(torch.randn_like(param) * 0.2)
    model.generation_config.eos_token_id = ids["</s>"]
    model.save_pretrained(str(out_dir), safe_serialization=True)
    fast = save_fast_tokenizer(
        tokenizer, out_dir, bos="<s>", eos="</s>", pad="<unk>", chat_template=CHAT_TEMPLATE
    )
    _save_processor(out_dir, fast)


def _save_processor(out_dir: Path, tokenizer) -> None:
    import json

    from transformers.models.pixtral.image_processing_pil_pixtral import (
        PixtralImageProcessorPil,
    )

    PixtralImageProcessorPil(
        size={"longest_edge": LONGEST_EDGE}, patch_size={"height": PATCH, "width": PATCH}
    ).save_pretrained(str(out_dir))
    # PixtralProcessor's settings as the published checkpoints carry them (the processor
    # class is marked as needing torchvision, so it is not built here to save itself).
    settings = {
        "patch_size": PATCH,
        "spatial_merge_size": MERGE,
        "image_token": "[IMG]",
        "image_break_token": "[IMG_BREAK]",
        "image_end_token": "[IMG_END]",
        "processor_class": "PixtralProcessor",
    }
    (out_dir / "processor_config.json").write_text(json.dumps(settings, indent=2) + "\n")
