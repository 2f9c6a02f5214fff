"""quantization_config (issue 37): which FP8 layouts are read, which layers stay unquantized,
and every other method refused by name, with one message, by the engine (the pod's load
path), the gateway and the encoder. The fingerprint takes the config in."""

from __future__ import annotations

import json
import shutil

import pytest

from iris.models import load_adapter
from iris.models.quantization import (
    SUPPORTED,
    UnsupportedQuantizationError,
    read_quantization,
)
from iris.multimodal import processor_fingerprint

FP8_WEIGHTS = {"num_bits": 8, "type": "float", "strategy": "channel", "symmetric": True}


def _compressed(inputs=None, weights=FP8_WEIGHTS, ignore=("lm_head",), fmt="float-quantized"):
    group = {"targets": ["Linear"], "weights": weights, "input_activations": inputs}
    return {
        "quant_method": "compressed-tensors",
        "format": fmt,
        "config_groups": {"group_0": group},
        "ignore": list(ignore),
    }


def test_compressed_tensors_schemes():
    dynamic = {"num_bits": 8, "type": "float", "strategy": "token", "dynamic": True}
    static = {"num_bits": 8, "type": "float", "strategy": "tensor", "dynamic": False}
    scheme = read_quantization({"quantization_config": _compressed(dynamic)})
    assert (scheme.strategy, scheme.activations, scheme.scale_name) == (
        "channel",
        "dynamic",
        "weight_scale",
    )
    assert read_quantization({"quantization_config": _compressed(static)}).activations == "static"
    assert read_quantization({"quantization_config": _compressed()}).activations is None
    # Nested under text_config (some VLM exports) is read too.
    nested = {"text_config": {"quantization_config": _compressed()}}
    assert read_quantization(nested).method == "compressed-tensors"
    assert read_quantization({"architectures": ["X"]}) is None
    # The format may sit in the group instead of the top level.
    per_group = _compressed(fmt="mixed-precision")
    per_group["config_groups"]["group_0"]["format"] = "float-quantized"
    assert read_quantization({"quantization_config": per_group}).strategy == "channel"


def test_ignore_and_modules_to_not_convert():
    ignore = ("lm_head", "re:.*visual.*", "model.layers.0.mlp.down_proj")
    scheme = read_quantization({"quantization_config": _compressed(ignore=ignore)})
    assert scheme.ignores("lm_head") and scheme.ignores("model.visual.blocks.0.attn.qkv")
    assert scheme.ignores("model.layers.0.mlp.down_proj")
    assert not scheme.ignores("model.layers.10.mlp.down_proj")
    assert not scheme.ignores("model.layers.0.mlp.up_proj")
    block = {
        "quant_method": "fp8",
        "weight_block_size": [128, 128],
        "modules_to_not_convert": ["lm_head", "vision_tower"],
    }
    scheme = read_quantization({"quantization_config": block})
    assert (scheme.strategy, scheme.block, scheme.scale_name) == (
        "block",
        (128, 128),
        "weight_scale_inv",
    )
    assert scheme.activations is None  # block-wise: weight-only
    assert scheme.ignores("model.vision_tower.encoder.layers.0.fc1")
    assert not scheme.ignores("model.language_model.layers.0.mlp.up_proj")


REFUSED = {
    "awq": ({"quant_method": "awq", "bits": 4, "group_size": 128}, "'awq'"),
    "gptq": ({"quant_method": "gptq", "bits": 4, "group_size": 128}, "'gptq'"),
    "bitsandbytes": ({"quant_method": "bitsandbytes", "load_in_4bit": True}, "'bitsandbytes'"),
    "bnb-legacy": ({"load_in_8bit": True}, "'bitsandbytes'"),
    "int8-compressed": (
        _compressed(weights={"num_bits": 8, "type": "int", "strategy": "channel"}),
        "'compressed-tensors' with weights",
    ),
    "packed": (_compressed(fmt="pack-quantized"), "format 'pack-quantized'"),
    "fp8-no-blocks": ({"quant_method": "fp8", "activation_scheme": "static"}, "weight_block_size"),
}


@pytest.mark.parametrize("name", REFUSED)
def test_other_methods_are_refused_by_name(name):
    config, named = REFUSED[name]
    with pytest.raises(UnsupportedQuantizationError) as error:
        read_quantization({"quantization_config": config})
    message = str(error.value)
    assert named in message
    assert all(supported in message for supported in SUPPORTED)


@pytest.fixture(scope="module")
def awq_dir(tiny_qwen2_vl_dir, tmp_path_factory):
    """The tiny Qwen2-VL checkpoint, its config declaring AWQ (the weights are unchanged:
    every part must refuse before it reads them)."""
    directory = tmp_path_factory.mktemp("awq") / "model"
    shutil.copytree(tiny_qwen2_vl_dir, directory)
    config = json.loads((directory / "config.json").read_text())
    config["quantization_config"] = REFUSED["awq"][0]
    (directory / "config.json").write_text(json.dumps(config))
    return directory


def test_engine_gateway_and_encoder_refuse_with_one_message(awq_dir):
    from encoder_svc.server import load_model
    from encoder_svc.settings import EncoderSettings
    from gateway.service import Gateway
    from gateway.settings import GatewaySettings
    from llm_svc.engine import EngineConfig, LLMEngine

    messages = []
    # The pod's load path (llm_svc/server/builder.py builds exactly this engine); a real
    # pod process is not started here: it re-raises this error and exits (seen by hand).
    with pytest.raises(UnsupportedQuantizationError) as error:
        LLMEngine(EngineConfig(awq_dir, num_pages=8))
    messages.append(str(error.value))
    with pytest.raises(UnsupportedQuantizationError) as error:
        Gateway(GatewaySettings(model=str(awq_dir)))
    messages.append(str(error.value))
    with pytest.raises(UnsupportedQuantizationError) as error:
        load_model(EncoderSettings(model=str(awq_dir)))
    messages.append(str(error.value))
    assert len(set(messages)) == 1 and "'awq'" in messages[0]


def test_fingerprint_includes_quantization_config(tiny_qwen2_vl_dir, tmp_path):
    config = json.loads((tiny_qwen2_vl_dir / "config.json").read_text())
    variants = {}
    for name, quantization in [
        ("bf16", None),
        ("fp8-channel", _compressed()),
        ("fp8-block", {"quant_method": "fp8", "weight_block_size": [128, 128]}),
    ]:
        directory = tmp_path / name
        shutil.copytree(tiny_qwen2_vl_dir, directory)
        if quantization is not None:
            written = dict(config, quantization_config=quantization)
            (directory / "config.json").write_text(json.dumps(written))
        variants[name] = processor_fingerprint(directory)
    assert variants["bf16"] == processor_fingerprint(tiny_qwen2_vl_dir)
    assert len(set(variants.values())) == 3
    assert load_adapter(tmp_path / "fp8-block").fingerprint == variants["fp8-block"]
