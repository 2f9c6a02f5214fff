"""Which layers slide, read from the config as transformers 5.24 reads it (checked against
the attention modules transformers itself builds), and the options refused at load."""

from __future__ import annotations

import json

import pytest

from llm_svc.engine.models.config import (
    SLIDING,
    TextModelConfig,
    UnsupportedModelError,
    sliding_layers,
)

SHAPE = dict(
    vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=6,
    num_attention_heads=2, num_key_value_heads=1, head_dim=8,
)  # fmt: skip
MOE = dict(num_experts=2, num_experts_per_tok=1, moe_intermediate_size=8)
CASES = [
    ("Qwen2", "qwen2", {}),
    ("Qwen2", "qwen2", dict(sliding_window=4)),  # published: a window but no use_sliding_window
    ("Qwen2", "qwen2", dict(use_sliding_window=True, sliding_window=4, max_window_layers=3)),
    ("Qwen3", "qwen3", dict(use_sliding_window=True, sliding_window=4, max_window_layers=2)),
    ("Qwen3", "qwen3", dict(sliding_window=4, max_window_layers=2)),
    ("Qwen3Moe", "qwen3_moe", dict(MOE, use_sliding_window=True, sliding_window=4)),
    ("Qwen3Moe", "qwen3_moe", dict(MOE, sliding_window=4)),
    ("Qwen2Moe", "qwen2_moe", dict(MOE, use_sliding_window=True, sliding_window=4)),
    (
        "Qwen2Moe",
        "qwen2_moe",
        dict(MOE, use_sliding_window=True, sliding_window=4, max_window_layers=3),
    ),
    ("Qwen2Moe", "qwen2_moe", dict(MOE, sliding_window=4, max_window_layers=3)),
    ("Gemma3", "gemma3", dict(sliding_window=4)),
    ("Gemma3", "gemma3", dict(sliding_window=4, sliding_window_pattern=3)),
    ("Gemma3", "gemma3", dict(sliding_window=4, layer_types=["full_attention"] * 6)),
    ("Mistral", "llama", dict(sliding_window=4)),
    ("Mistral", "llama", dict(sliding_window=None)),
]


def _hf_sliding(stem: str, keys: dict) -> tuple[bool, ...]:
    """Whether each layer of the model transformers builds attends through a window."""
    import transformers as tf

    config_cls = getattr(tf, f"{stem}TextConfig" if stem == "Gemma3" else f"{stem}Config")
    config = config_cls(**SHAPE, **keys)
    model = getattr(tf, f"{stem}ForCausalLM")(config)
    if stem == "Mistral":  # the window is read from the config in each layer's forward
        return tuple(bool(config.sliding_window) for _ in model.model.layers)
    return tuple(
        bool(getattr(layer.self_attn, "sliding_window", None)) for layer in model.model.layers
    )


@pytest.mark.parametrize(("stem", "family", "keys"), CASES)
def test_sliding_layers_follow_transformers(stem, family, keys):
    import transformers as tf

    config_cls = getattr(tf, f"{stem}TextConfig" if stem == "Gemma3" else f"{stem}Config")
    saved = config_cls(**SHAPE, **keys).to_dict()  # what save_pretrained writes
    ours = sliding_layers(f"{stem}ForCausalLM", family, saved)
    assert tuple(kind == SLIDING for kind in ours) == _hf_sliding(stem, keys)


def _write(tmp_path, **text):
    config = dict(SHAPE, architectures=[text.pop("arch", "Gemma3ForCausalLM")], **text)
    (tmp_path / "config.json").write_text(json.dumps(config))
    return tmp_path


@pytest.mark.parametrize(
    ("keys", "needle"),
    [
        (dict(final_logit_softcapping=30.0), "final_logit_softcapping"),
        (dict(attn_logit_softcapping=50.0), "attn_logit_softcapping"),
        (dict(use_bidirectional_attention=True), "use_bidirectional_attention"),
        (dict(rope_scaling={"rope_type": "yarn", "factor": 4.0}), "'yarn'"),
        (dict(rope_parameters={"rope_type": "llama3", "factor": 8.0}), "'llama3'"),
        (
            dict(rope_parameters={"full_attention": {"rope_type": "dynamic"}}),
            "'dynamic' (full_attention layers)",
        ),
        (dict(arch="LlamaForCausalLM", attention_chunk_size=8192), "attention_chunk_size"),
        (dict(hidden_activation="relu"), "activation 'relu'"),
        (dict(arch="Llama4ForCausalLM"), "Llama4ForCausalLM"),
        (
            dict(
                arch="Qwen3MoeForCausalLM",
                **MOE,
                quantization_config={
                    "quant_method": "compressed-tensors",
                    "format": "float-quantized",
                    "config_groups": {
                        "g": {
                            "weights": {
                                "num_bits": 8,
                                "type": "float",
                                "strategy": "channel",
                            }
                        }
                    },
                },
            ),
            "FP8 experts with 'compressed-tensors' channel scales",
        ),  # fmt: skip
    ],
)
def test_unsupported_options_are_refused_by_name(tmp_path, keys, needle):
    with pytest.raises(UnsupportedModelError) as error:
        TextModelConfig.from_model_dir(_write(tmp_path, **keys))
    assert needle in str(error.value)


def test_an_unknown_architecture_names_the_supported_ones(tmp_path):
    with pytest.raises(UnsupportedModelError) as error:
        TextModelConfig.from_model_dir(_write(tmp_path, arch="Olmo2ForCausalLM"))
    for known in ("Qwen3ForCausalLM", "Qwen3MoeForCausalLM", "Gemma3ForCausalLM"):
        assert known in str(error.value)


def test_gemma3_ropes_per_layer_kind_from_either_config_format(tmp_path):
    old = TextModelConfig.from_model_dir(
        _write(
            tmp_path,
            sliding_window=4,
            rope_theta=1e6,
            rope_local_base_freq=1e4,
            rope_scaling={"rope_type": "linear", "factor": 8.0},
        )  # fmt: skip
    )
    assert old.rope("full").theta == 1e6 and old.rope("full").linear_factor == 8.0
    assert old.rope(SLIDING).theta == 1e4 and old.rope(SLIDING).linear_factor == 1.0
    assert old.layer_types == (SLIDING,) * 5 + ("full",)
