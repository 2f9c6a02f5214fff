"""The demo checkpoint: SmolVLM-256M-Instruct's architecture, SmolLM2-135M-Instruct answers.
The first build takes about a minute (then cached under .cache/models). Images stay at one
512-pixel tile here: the SigLIP-base tower costs about a second a tile on one core."""

from __future__ import annotations

import json

import pytest
import torch
from PIL import Image

from iris.models import load_adapter

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def demo(demo_model_dir):
    return load_adapter(demo_model_dir)


def test_demo_answers_the_france_question(demo, demo_model_dir):
    from transformers import Idefics3ForConditionalGeneration

    model = Idefics3ForConditionalGeneration.from_pretrained(str(demo_model_dir)).eval()
    prompt = demo.apply_chat_template(
        [{"role": "user", "content": [{"type": "text", "text": "What is the capital of France?"}]}]
    )
    ids = torch.tensor([demo.encode_prompt(prompt)])
    with torch.inference_mode():
        out = model.generate(input_ids=ids, max_new_tokens=12, do_sample=False)
    answer = demo.tokenizer().decode(out[0, ids.shape[1] :], skip_special_tokens=True)
    assert "Paris" in answer, answer


def test_demo_contract_and_facts(demo):
    assert demo.vocab_size < 1_000_000
    assert demo.tokenizer().pad_token_id != demo.tokenizer().eos_token_id
    assert demo.lm_head_name == "model.text_model.embed_tokens.weight"  # tied embeddings
    assert demo.text_config["num_hidden_layers"] == 30
    # SmolVLM-256M-Instruct's published vision config and connector.
    config = json.loads((demo.model_dir / "config.json").read_text())
    vision = config["vision_config"]
    published = {"hidden_size": 768, "intermediate_size": 3072, "num_hidden_layers": 12}
    assert {key: vision[key] for key in published} == published
    assert (vision["num_attention_heads"], vision["image_size"], vision["patch_size"]) == (
        12,
        512,
        16,
    )
    assert config["scale_factor"] == 4
    # One tile an image by default: 1,024 patches a tile become 64 tokens.
    assert demo.image_token_count(2000, 1000)[0] == 64


def test_demo_full_resolution_keeps_the_published_image_settings():
    from iris.models.demo import preprocessor

    full, capped = preprocessor(full_resolution=True), preprocessor(full_resolution=False)
    assert full["size"] == {"longest_edge": 2048} and capped["size"] == {"longest_edge": 512}
    assert full["max_image_size"] == capped["max_image_size"] == {"longest_edge": 512}


def test_demo_expansion_matches_idefics3_processor(demo):
    # SmolLM2's tokenizer merges "\n\n" into one token (the tiny one does not): both agree.
    from transformers import Idefics3Processor

    assert len(demo.encode_prompt("\n\n")) == 1
    processor = Idefics3Processor.from_pretrained(str(demo.model_dir))
    sizes = [(700, 300), (90, 90)]
    content = [{"type": "image"}, {"type": "text", "text": "and"}, {"type": "image"}]
    prompt = demo.apply_chat_template([{"role": "user", "content": content}])
    images = [Image.new("RGB", size) for size in sizes]
    expected = processor(text=[prompt], images=[images])["input_ids"][0]
    grids = [demo.image_token_count(*size)[1] for size in sizes]
    assert demo.expand_prompt(demo.encode_prompt(prompt), grids)[0] == list(expected)


def test_demo_vision_runner_shape(demo):
    runner = demo.vision_runner()
    (out,) = runner.encode([runner.preprocess(Image.new("RGB", (300, 200), (1, 2, 3)))])
    assert out.shape == (demo.image_token_count(300, 200)[0], 576)
