"""Model runner seams for the multimodal path: input embeddings and M-RoPE positions."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from llm_svc.engine import EngineConfig, SamplingParams
from llm_svc.engine.model_runner import ModelRunner
from llm_svc.engine.models import TextModelConfig, find_text_prefix
from llm_svc.engine.scheduler import ScheduledChunk
from llm_svc.engine.sequence import Sequence
from tests.llm_svc.checkpoints import tiny_checkpoint


def _runner(kind: str) -> ModelRunner:
    return ModelRunner(EngineConfig(tiny_checkpoint(kind), page_size=4, num_pages=16))


def _chunk(seq: Sequence, pages: list[int]) -> ScheduledChunk:
    seq.block_table = pages
    return ScheduledChunk(seq, 0, seq.num_tokens)


def test_input_embeds_replace_the_embedding_lookup():
    runner = _runner("llama")
    seq = Sequence("e", list(range(3, 12)), SamplingParams())
    inputs = runner.prepare([_chunk(seq, [0, 1, 2])])
    by_ids = runner.execute(inputs)
    embeds = runner.model.embed(inputs.input_ids)
    assert torch.equal(runner.execute(inputs, input_embeds=embeds), by_ids)
    assert not torch.equal(runner.execute(inputs, input_embeds=embeds * 0.5), by_ids)


def test_mrope_text_positions_equal_plain_positions():
    runner = _runner("qwen2_vl")
    assert runner.model_config.mrope_section == (2, 3, 3)
    ids = list(range(3, 12))
    plain = Sequence("p", ids, SamplingParams())
    table = np.tile(np.arange(len(ids)), (3, 1))
    rows = Sequence("m", ids, SamplingParams(), mrope_positions=table)
    inputs = runner.prepare([_chunk(rows, [0, 1, 2])])
    assert tuple(inputs.positions.shape) == (3, len(ids))
    logits_rows = runner.execute(inputs)
    logits_plain = runner.execute(runner.prepare([_chunk(plain, [3, 4, 5])]))
    torch.testing.assert_close(logits_rows, logits_plain)


def test_positions_past_the_mrope_table_continue_from_its_maximum():
    table = np.array([[0, 1, 1, 1, 4], [0, 1, 1, 2, 4], [0, 1, 2, 1, 4]])
    seq = Sequence("q", [1, 2, 3, 4, 5], SamplingParams(), mrope_positions=table)
    seq.append_token(6)
    seq.append_token(7)
    assert seq.positions(3, 7).tolist() == [[1, 4, 5, 6], [2, 4, 5, 6], [1, 4, 5, 6]]
    assert seq.positions(6, 7).tolist() == [[6], [6], [6]]
    assert Sequence("t", [1, 2], SamplingParams()).positions(0, 2).tolist() == [0, 1]


@pytest.mark.parametrize(
    ("names", "prefix"),
    [
        (["model.embed_tokens.weight", "lm_head.weight"], "model."),
        (["model.text_model.embed_tokens.weight", "model.vision_model.x"], "model.text_model."),
        (["model.language_model.embed_tokens.weight", "visual.x"], "model.language_model."),
    ],
)
def test_language_model_prefix_is_found_in_each_layout(names, prefix):
    assert find_text_prefix(names) == prefix


def test_vlm_configs_read_their_text_config():
    qwen = TextModelConfig.from_model_dir(tiny_checkpoint("qwen2_vl"))
    idefics = TextModelConfig.from_model_dir(tiny_checkpoint("idefics3"))
    assert (qwen.family, qwen.attention_bias, qwen.hidden_size) == ("qwen2", True, 64)
    assert (idefics.family, idefics.attention_bias, idefics.mrope_section) == ("llama", False, None)
