"""Registry, torch-free counting, the checkpoints' HF layout, and the atomic builder."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from iris.models import (
    has_adapter,
    language_model_architectures,
    load_adapter,
    registered_architectures,
    text_family,
)
from iris.models.build import COMPLETE_MARKER, build_atomically


def test_registered_architectures():
    assert registered_architectures() == [
        "Gemma3ForConditionalGeneration",
        "Gemma4ForConditionalGeneration",
        "Idefics3ForConditionalGeneration",
        "InternVLForConditionalGeneration",
        "Mistral3ForConditionalGeneration",
        "Qwen2VLForConditionalGeneration",
        "Qwen2_5_VLForConditionalGeneration",
        "Qwen3VLForConditionalGeneration",
        "Qwen3VLMoeForConditionalGeneration",
        "Qwen3_5ForConditionalGeneration",
        "Qwen3_5MoeForConditionalGeneration",
        "SmolVLMForConditionalGeneration",
    ]


def test_one_registry_knows_adapters_and_plain_language_models():
    # The engine builds its decoder from text_family; only the VLMs have an adapter.
    assert text_family("SmolVLMForConditionalGeneration") == "llama"
    assert text_family("Qwen2_5_VLForConditionalGeneration") == "qwen2"
    assert text_family("MistralForCausalLM") == "llama"
    assert text_family("Qwen2ForCausalLM") == "qwen2"
    assert text_family("Qwen3_5MoeForCausalLM") == "qwen3_5_moe"
    assert text_family("Qwen3_5ForConditionalGeneration") == "qwen3_5"
    assert text_family("Qwen3_5MoeForConditionalGeneration") == "qwen3_5_moe"
    assert has_adapter("Qwen2VLForConditionalGeneration")
    assert not has_adapter("LlamaForCausalLM")
    assert set(registered_architectures()) < set(language_model_architectures())
    with pytest.raises(ValueError, match="'GPT2LMHeadModel'.*LlamaForCausalLM.*SmolVLMFor"):
        text_family("GPT2LMHeadModel")


def test_unknown_architecture_lists_registered(tiny_qwen2_vl_dir, tmp_path):
    config = json.loads((tiny_qwen2_vl_dir / "config.json").read_text())
    config["architectures"] = ["LlavaForConditionalGeneration"]
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="'LlavaForConditionalGeneration'.*Qwen2VLForCondi"):
        load_adapter(tmp_path)
    config.pop("architectures")
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="no 'architectures'.*Idefics3ForConditionalGeneration"):
        load_adapter(tmp_path)


def test_missing_directory_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="no config.json"):
        load_adapter(tmp_path / "nowhere")


def test_adapter_facts(tiny_qwen2_vl_dir, tiny_idefics3_dir):
    qwen, idefics = load_adapter(tiny_qwen2_vl_dir), load_adapter(tiny_idefics3_dir)
    assert qwen.uses_mrope and not idefics.uses_mrope
    assert qwen.text_weight_prefix == "model." and idefics.text_weight_prefix == "model.text_model."
    for adapter in (qwen, idefics):
        names = set(adapter.weight_names)
        assert adapter.text_weight_prefix + "layers.1.self_attn.q_proj.weight" in names
        assert adapter.lm_head_name in names
        assert adapter.text_config["hidden_size"] == adapter.hidden_size == 64
        assert adapter.vocab_size < 5000 and len(adapter.fingerprint) == 32
    assert qwen.fingerprint != idefics.fingerprint
    assert qwen.eos_token_ids == [qwen.tokenizer().convert_tokens_to_ids("<|im_end|>")]
    assert idefics.eos_token_ids == [
        idefics.tokenizer().convert_tokens_to_ids("<end_of_utterance>")
    ]


def test_gateway_path_does_not_import_torch(
    tiny_qwen2_vl_dir, tiny_idefics3_dir, tiny_internvl_dir
):
    dirs = [str(d) for d in (tiny_qwen2_vl_dir, tiny_idefics3_dir, tiny_internvl_dir)]
    code = f"""
import sys
from iris.models import load_adapter
for d in {dirs!r}:
    a = load_adapter(d)
    _, grid = a.image_token_count(640, 480)
    message = {{"role": "user", "content": [{{"type": "image"}}]}}
    ids = a.encode_prompt(a.apply_chat_template([message]))
    a.expand_prompt(ids, [grid])
assert "torch" not in sys.modules, "torch was imported"
print("ok")
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"


@pytest.mark.parametrize(
    "fixture",
    ["tiny_qwen2_vl_dir", "tiny_qwen2_5_vl_dir", "tiny_idefics3_dir", "tiny_internvl_dir"],
)
def test_tiny_checkpoints_load_with_auto_classes(fixture, request):
    from transformers import (
        AutoConfig,
        AutoImageProcessor,
        AutoModelForImageTextToText,
        AutoTokenizer,
    )

    model_dir = str(request.getfixturevalue(fixture))
    config = AutoConfig.from_pretrained(model_dir)
    assert config.text_config.num_hidden_layers == 2
    model = AutoModelForImageTextToText.from_pretrained(model_dir)
    assert type(model).__name__ == config.architectures[0]
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    assert (
        tokenizer.convert_tokens_to_ids(load_adapter(model_dir).image_token)
        == config.image_token_id
    )
    AutoImageProcessor.from_pretrained(model_dir)


def test_build_is_atomic(tmp_path):
    target = tmp_path / "ckpt"

    def failing(out: Path) -> None:
        (out / "half-written").write_text("x")
        raise RuntimeError("builder crashed")

    with pytest.raises(RuntimeError, match="builder crashed"):
        build_atomically(target, failing)
    assert not target.exists()
    assert list(tmp_path.iterdir()) == []  # no temp directory left behind

    calls = []

    def writing(out: Path) -> None:
        calls.append(out)
        (out / "config.json").write_text("{}")

    assert build_atomically(target, writing) == target
    assert (target / COMPLETE_MARKER).is_file() and (target / "config.json").is_file()
    build_atomically(target, writing)  # complete: kept, not rebuilt
    assert len(calls) == 1

    shutil.rmtree(target)
    target.mkdir()
    (target / "stale").write_text("partial")  # no marker: replaced
    build_atomically(target, writing)
    assert not (target / "stale").exists() and len(calls) == 2


def test_cli_make_tiny(tmp_path):
    from typer.testing import CliRunner

    from iris.cli import app

    runner = CliRunner()
    bad = runner.invoke(app, ["models", "make-tiny", "--arch", "llava", str(tmp_path / "x")])
    assert bad.exit_code != 0 and "llava" in bad.output
    good = runner.invoke(app, ["models", "make-tiny", "--arch", "qwen2_vl", str(tmp_path / "q")])
    assert good.exit_code == 0, good.output
    assert load_adapter(tmp_path / "q").architecture == "Qwen2VLForConditionalGeneration"
    listed = runner.invoke(app, ["models", "make-tiny", "--help"]).output
    assert "internvl" in listed
