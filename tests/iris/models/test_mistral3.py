"""Mistral Small 3 (Pixtral tower): the token count from the header equals Pixtral's
processor rule on a sweep of sizes, the expansion is PixtralProcessor's layout (rows of
[IMG] broken by [IMG_BREAK], the last ending [IMG_END]) as one span per row, and the
options Iris does not serve are refused by name. PixtralProcessor's module imports
torchvision, which does not import beside the CPU torch here, so the comparison is with
its PIL image processor's resize (the function the processor counts with) and the
processor's replacement rule written out from its source."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
from PIL import Image

from iris.models import UnsupportedModelError, load_adapter
from tests.iris.models.test_internvl import SIZES


def _processor_layout(height: int, width: int, block: int) -> list[str]:
    # PixtralProcessor.replace_image_token, as transformers 5.24 writes it.
    row = ["[IMG]"] * (width // block) + ["[IMG_BREAK]"]
    tokens = row * (height // block)
    tokens[-1] = "[IMG_END]"
    return tokens


@pytest.mark.parametrize("longest_edge", [1540, 128])
def test_counts_equal_pixtrals_rule_on_the_sweep(tiny_mistral3_dir, tmp_path, longest_edge):
    from transformers.models.pixtral.image_processing_pil_pixtral import (
        get_resize_output_image_size,
    )

    model_dir = tmp_path / "model"
    shutil.copytree(tiny_mistral3_dir, model_dir)
    path = model_dir / "preprocessor_config.json"
    path.write_text(
        json.dumps(json.loads(path.read_text()) | {"size": {"longest_edge": longest_edge}})
    )
    adapter = load_adapter(model_dir)
    block = adapter.rule.block
    for width, height in SIZES:
        h, w = get_resize_output_image_size(
            np.zeros((height, width, 3)),
            size=(longest_edge, longest_edge),
            patch_size=(block, block),
            input_data_format="channels_last",
        )
        count, grid = adapter.image_token_count(width, height)
        assert grid == (h // block, w // block) and count == grid[0] * grid[1], (width, height)


def test_expansion_is_the_processors_layout_with_one_span_per_row(tiny_mistral3_dir):
    adapter = load_adapter(tiny_mistral3_dir)
    runner = adapter.vision_runner()
    tokenizer = adapter.tokenizer()
    for width, height in [(1, 1), (112, 112), (300, 40), (40, 300), (129, 64)]:
        image = Image.new("RGB", (width, height), (9, 99, 199))
        prepared = runner.preprocess(image)
        h, w = prepared.extra["image_size"]
        count, grid = adapter.image_token_count(width, height)
        assert (prepared.token_count, prepared.grid) == (count, grid)
        text = "[INST]See [IMG]this[/INST]"
        ids, spans = adapter.expand_prompt(adapter.encode_prompt(text), [grid])
        layout = _processor_layout(h, w, adapter.rule.block)
        expected = adapter.encode_prompt(text.replace("[IMG]", "".join(layout)))
        assert ids == expected
        assert len(spans[0]) == grid[0]
        assert all(end - start + 1 == grid[1] for start, end in spans[0])
        assert all(ids[end + 1] in tokenizer.convert_tokens_to_ids(["[IMG_BREAK]", "[IMG_END]"])
                   for _, end in spans[0])  # fmt: skip


@pytest.mark.parametrize(
    ("change", "named"),
    [
        ({"text_model_type": "ministral3"}, "ministral3"),
        ({"vision_feature_layer": [-1, -2]}, "vision_feature_layer"),
    ],
)
def test_refused_by_name_at_load(tiny_mistral3_dir, tmp_path, change, named):
    from llm_svc.engine.models.config import TextModelConfig
    from llm_svc.engine.models.config import UnsupportedModelError as EngineError
    from tests.iris.models.test_internvl import _edited

    model_dir, _ = _edited(tiny_mistral3_dir, tmp_path, **change)
    with pytest.raises(UnsupportedModelError, match=named):
        load_adapter(model_dir)
    with pytest.raises(EngineError, match=named):
        TextModelConfig.from_model_dir(model_dir)
