"""What tensor parallelism refuses at start (before any rank starts), each with the value
and the limit in its message, and how a rank's share of heads and vocabulary is laid out."""

from __future__ import annotations

import json
import shutil

import pytest

from llm_svc.engine import EngineConfig
from llm_svc.engine.parallel.group import RankLayout
from llm_svc.settings import LLMSettings


def test_a_size_that_does_not_divide_the_heads_is_refused(llama_dir):
    with pytest.raises(ValueError, match="tensor_parallel_size 3 does not divide .* 4 attention"):
        EngineConfig(llama_dir, tensor_parallel_size=3, device="cpu")
    with pytest.raises(ValueError, match="tensor_parallel_size must be >= 1, got 0"):
        EngineConfig(llama_dir, tensor_parallel_size=0, device="cpu")


def test_more_ranks_than_cuda_devices_is_refused(llama_dir):
    import torch

    count = torch.cuda.device_count()
    if count >= 4:
        pytest.skip(f"{count} CUDA devices: every size the tiny model's 4 heads allow fits")
    size = 2 if count < 2 else 4
    with pytest.raises(ValueError, match=f"tensor_parallel_size {size} .*; {count} visible"):
        EngineConfig(llama_dir, tensor_parallel_size=size, device="cuda")


def test_a_quantized_checkpoint_above_size_1_is_refused(llama_dir, tmp_path):
    model = tmp_path / "quantized"
    shutil.copytree(llama_dir, model)
    config = json.loads((model / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "fp8", "weight_block_size": [128, 128]}
    (model / "config.json").write_text(json.dumps(config))
    EngineConfig(model, tensor_parallel_size=1, device="cpu")  # size 1 serves it
    with pytest.raises(ValueError, match=r"quantized checkpoint \(fp8\)"):
        EngineConfig(model, tensor_parallel_size=2, device="cpu")


def test_the_pod_setting_is_read_from_its_environment(monkeypatch):
    monkeypatch.setenv("IRIS_LLM_TENSOR_PARALLEL_SIZE", "2")
    assert LLMSettings().tensor_parallel_size == 2
    monkeypatch.setenv("IRIS_LLM_TENSOR_PARALLEL_SIZE", "0")
    with pytest.raises(ValueError, match="tensor_parallel_size"):
        LLMSettings()


def test_kv_heads_split_or_replicate_and_vocab_pads():
    # 2 KV heads on 4 ranks: each KV head serves the two ranks whose query heads read it.
    assert [RankLayout(rank, 4).kv_heads(2) for rank in range(4)] == [
        (0, 1),
        (0, 1),
        (1, 2),
        (1, 2),
    ]
    assert [RankLayout(rank, 2).kv_heads(4) for rank in range(2)] == [(0, 2), (2, 4)]
    # A vocabulary of 10 on 4 ranks: 3 rows each, the last rank's padded past row 9.
    assert [RankLayout(rank, 4).vocab_slice(10) for rank in range(4)] == [
        (0, 3), (3, 6), (6, 9), (9, 12)
    ]  # fmt: skip
