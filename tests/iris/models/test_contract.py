"""The token contract fails fast at load, naming both values."""

from __future__ import annotations

import json
import shutil

import pytest

from iris.models import TokenContractError, load_adapter

CONFIG_FILES = [
    "config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "chat_template.jinja",
    "preprocessor_config.json",
    "processor_config.json",
]


@pytest.fixture
def model_copy(tiny_idefics3_dir, tmp_path):
    """The tiny checkpoint's config and tokenizer files (load_adapter reads no weights)."""
    for name in CONFIG_FILES:
        if (tiny_idefics3_dir / name).exists():
            shutil.copy(tiny_idefics3_dir / name, tmp_path / name)
    return tmp_path


def _edit_json(path, edit):
    data = json.loads(path.read_text())
    edit(data)
    path.write_text(json.dumps(data))


def test_the_tiny_checkpoint_meets_the_contract(model_copy):
    load_adapter(model_copy)


def test_image_token_id_must_match_tokenizer(model_copy):
    real = load_adapter(model_copy).image_token_id
    _edit_json(model_copy / "config.json", lambda c: c.update(image_token_id=real + 1))
    with pytest.raises(TokenContractError, match=f"image_token_id={real + 1} .* to {real}"):
        load_adapter(model_copy)


def test_vocab_must_stay_below_sentinels(model_copy):
    _edit_json(model_copy / "config.json", lambda c: c["text_config"].update(vocab_size=1_000_000))
    with pytest.raises(ValueError, match="vocab_size 1000000 >= 1000000"):
        load_adapter(model_copy)


def test_tokenizer_ids_must_fit_the_embedding(model_copy):
    _edit_json(model_copy / "config.json", lambda c: c["text_config"].update(vocab_size=100))
    with pytest.raises(TokenContractError, match=r"token id \d+ but the model's vocab_size is 100"):
        load_adapter(model_copy)


def test_eos_must_be_defined(model_copy):
    _edit_json(model_copy / "tokenizer_config.json", lambda c: c.pop("eos_token"))
    _edit_json(model_copy / "config.json", lambda c: c["text_config"].pop("eos_token_id"))
    with pytest.raises(TokenContractError, match="eos=None"):
        load_adapter(model_copy)


def test_pad_may_equal_eos_on_every_side(model_copy, monkeypatch):
    """One rule, which the gateway, the encoder and the engine all call: pad = eos is
    served (before, the gateway and the encoder refused what the engine ran)."""
    from encoder_svc.server import load_model
    from encoder_svc.settings import EncoderSettings
    from gateway.service import Gateway
    from gateway.settings import GatewaySettings
    from llm_svc.engine.engine import load_vlm_adapter

    _edit_json(model_copy / "tokenizer_config.json", lambda c: c.update(pad_token=c["eos_token"]))
    adapter = load_adapter(model_copy)
    assert adapter.tokenizer().pad_token_id == adapter.tokenizer().eos_token_id
    assert load_vlm_adapter(model_copy, adapter.architecture) is not None
    Gateway(GatewaySettings(model=str(model_copy), llm_addresses=["127.0.0.1:1"]))
    monkeypatch.setattr(type(adapter), "vision_runner", lambda self, **kw: object())
    load_model(EncoderSettings(model=str(model_copy)))


def test_pad_must_not_be_the_image_token(model_copy):
    image_token = load_adapter(model_copy).image_token
    _edit_json(model_copy / "tokenizer_config.json", lambda c: c.update(pad_token=image_token))
    with pytest.raises(TokenContractError, match=r"pad_token_id=\d+ is the image token"):
        load_adapter(model_copy)
