"""The Triton attention backend through the whole engine, and how a pod picks its backend.

Triton runs here in its CPU interpreter (TRITON_INTERPRET=1, set per test: the kernels are
built for the mode in force at launch). No GPU is needed; the compiled path is the same
kernel code, checked on a CUDA machine by bench/engine.py --only attention.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import typing

import pytest
import torch

import iris_kernels
from iris.settings import SettingsError
from llm_svc import LLM
from llm_svc.engine import EngineConfig, LLMEngine
from llm_svc.engine.attention import CHOICES, KVCache, make_backend, resolve_backend_name
from llm_svc.engine.attention.sdpa import SdpaBackend
from llm_svc.engine.attention.triton import TritonBackend
from llm_svc.server.builder import build_engine
from llm_svc.settings import LLMSettings
from tests.llm_svc.checkpoints import TEXT, tiny_checkpoint
from tests.llm_svc.conftest import greedy, run_all, token_ids
from tests.llm_svc.mm_reference import make_image
from tests.llm_svc.server.pods import pod_settings

MAX_NEW = 6


@pytest.fixture
def interpreted(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert iris_kernels.interpreting()


def _prompts(reference):
    return [
        reference.prompt(["Describe", "please"], [make_image(0)]),
        reference.prompt(["Compare", "with", "now"], [make_image(1), make_image(2, (64, 96))]),
        reference.prompt(["Describe", "please"], [make_image(0)]),  # a prefix-cache hit
    ]


def _generate(reference, backend: str, chunk: int) -> list[list[int]]:
    llm = LLM(reference.model_dir, page_size=4, num_pages=512, max_num_seqs=4,
              max_num_batched_tokens=chunk, attention_backend=backend)  # fmt: skip
    assert llm.engine.runner.backend.name == backend
    prompts = _prompts(reference)
    outputs = llm.generate(
        prompt_token_ids=[p.ids for p in prompts],
        images=[p.images for p in prompts],
        sampling_params=greedy(MAX_NEW),
        use_tqdm=False,
    )
    return [out.token_ids for out in outputs]


def test_greedy_with_images_equals_sdpa_token_for_token(interpreted, mm_reference):
    # Chunks one token shorter than the shortest image span, so every span is cut inside
    # (and the step budget stays as large as that allows: interpreted kernels are slow);
    # steps mix one request's decodes with another's prefill chunks.
    spans = [e - s + 1 for p in _prompts(mm_reference) for i in p.items for s, e in i.offsets]
    chunk = min(spans) - 1
    assert chunk >= 2
    decode = iris_kernels.CALLS[("paged_decode_attention", "triton")]
    extend = iris_kernels.CALLS[("paged_extend_attention", "triton")]
    triton_tokens = _generate(mm_reference, "triton", chunk)
    assert iris_kernels.CALLS[("paged_decode_attention", "triton")] > decode
    assert iris_kernels.CALLS[("paged_extend_attention", "triton")] > extend
    assert triton_tokens == _generate(mm_reference, "sdpa", chunk)
    assert all(len(tokens) == MAX_NEW for tokens in triton_tokens)


def test_greedy_text_with_mid_page_chunks_equals_sdpa(interpreted, llama_dir):
    prompts = [list(range(10, 10 + n)) for n in (3, 17, 30)]
    results = {}
    for backend in ("triton", "sdpa"):
        config = EngineConfig(llama_dir, page_size=4, num_pages=64, max_num_seqs=4,
                              max_num_batched_tokens=7, attention_backend=backend)  # fmt: skip
        engine = LLMEngine(config)
        requests = {f"r{i}": (ids, greedy(MAX_NEW)) for i, ids in enumerate(prompts)}
        results[backend] = {rid: token_ids(out) for rid, out in run_all(engine, requests).items()}
        engine.close()
    assert results["triton"] == results["sdpa"]


# --- choosing the backend ---------------------------------------------------------------


def _cache(head_dim=16, dtype=torch.float32, device="cpu"):
    return KVCache.allocate(1, 2, 4, 2, head_dim, dtype, torch.device(device))


def test_auto_is_sdpa_on_cpu_and_triton_on_cuda(interpreted):
    assert resolve_backend_name("auto", _cache()) == "sdpa"
    assert resolve_backend_name("auto", _cache(device="meta")) == "sdpa"
    assert resolve_backend_name("triton", _cache()) == "triton"
    assert isinstance(make_backend("sdpa", _cache()), SdpaBackend)
    assert isinstance(make_backend("triton", _cache()), TritonBackend)
    assert isinstance(make_backend("auto", _cache()), SdpaBackend)
    if torch.cuda.is_available():
        assert resolve_backend_name("auto", _cache(device="cuda")) == "triton"


def test_a_dtype_triton_cannot_serve_falls_back_to_sdpa(interpreted, caplog):
    with caplog.at_level(logging.WARNING, logger="llm_svc.engine.attention"):
        backend = make_backend("triton", _cache(dtype=torch.float64))
    assert isinstance(backend, SdpaBackend)
    assert [r.getMessage() for r in caplog.records if "float64" in r.getMessage()], caplog.text


def test_forced_triton_on_cpu_without_the_interpreter_is_refused(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(ValueError, match="'triton' needs a CUDA device"):
        make_backend("triton", _cache())


def test_unknown_backend_names_the_choices():
    with pytest.raises(ValueError, match="'flash'; supported: auto, sdpa, triton"):
        make_backend("flash", _cache())
    with pytest.raises(ValueError, match="'flash'; supported: auto, sdpa, triton"):
        EngineConfig(tiny_checkpoint("llama"), attention_backend="flash")


def test_the_settings_offer_exactly_the_engine_choices():
    field = LLMSettings.model_fields["attention_backend"]
    assert set(typing.get_args(field.annotation)) == set(CHOICES)
    assert field.default == "auto"


def test_a_pod_with_an_unknown_backend_refuses_to_start(llama_dir):
    with pytest.raises(SettingsError, match="IRIS_LLM_ATTENTION_BACKEND.*'auto', 'sdpa'"):
        pod_settings(llama_dir, attention_backend="flash")
    run = subprocess.run(
        [sys.executable, "-m", "llm_svc", "--model", str(llama_dir), "--port", "0"],
        env={**os.environ, "IRIS_LLM_ATTENTION_BACKEND": "flash"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 2, run.stderr
    assert "IRIS_LLM_ATTENTION_BACKEND" in run.stderr
    assert "'auto', 'sdpa' or 'triton'" in run.stderr


@pytest.fixture(scope="module")
def head_dim_12_dir(tmp_path_factory):
    """A tiny Llama whose head dim (48 / 4 = 12) the Triton kernels do not cover."""
    import shutil

    import transformers as tf

    source = tiny_checkpoint("llama")
    out = tmp_path_factory.mktemp("head-dim-12")
    torch.manual_seed(0)
    config = tf.LlamaConfig(**dict(TEXT, hidden_size=48), tie_word_embeddings=True)
    tf.LlamaForCausalLM(config).save_pretrained(out)
    for path in source.iterdir():
        if "token" in path.name or path.name == "special_tokens_map.json":
            shutil.copy(path, out / path.name)
    return out


def test_a_head_dim_triton_cannot_serve_falls_back_to_sdpa_with_one_warning(
    interpreted, head_dim_12_dir, caplog
):
    prompt = list(range(10, 31))
    tokens = {}
    for backend in ("triton", "sdpa"):
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="llm_svc.engine.attention"):
            engine = build_engine(pod_settings(head_dim_12_dir, attention_backend=backend))
        warnings = [r.getMessage() for r in caplog.records if r.name == "llm_svc.engine.attention"]
        assert engine.runner.backend.name == "sdpa"
        if backend == "triton":
            assert len(warnings) == 1 and "head dim 12" in warnings[0], warnings
        else:
            assert warnings == []
        tokens[backend] = token_ids(run_all(engine, {"r": (prompt, greedy(MAX_NEW))})["r"])
        engine.close()
    assert tokens["triton"] == tokens["sdpa"] and len(tokens["sdpa"]) == MAX_NEW
