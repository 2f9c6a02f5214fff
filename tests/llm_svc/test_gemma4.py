"""Gemma 4 (llm_svc/engine/models/gemma4.py) beyond the HF parity of test_families.py:
each layer kind's pool has its own page shape and only the layers that keep KV have a layer
in it, the byte budget and the max_model_len rule count those pages, the memory profile
runs on both pools, a tied head with soft-capped logits matches HF's logits, the KV-shared
layers are read as transformers pairs them and run on the sampled rows only, Triton reads
both pools and the shared layers' KV as SDPA does, every option Gemma 4 does not serve is
refused at load by name, a tensor-parallel size is checked against each kind's KV heads,
and `iris models make-tiny --arch gemma4_text` builds the model
(per-layer embeddings and the MoE block: test_gemma4_ple_moe.py)."""

from __future__ import annotations

import json

import pytest
import torch

from iris.models.build import build_atomically
from llm_svc.engine import EngineConfig, SamplingParams
from llm_svc.engine.attention import KVCache
from llm_svc.engine.kv_sizing import profile_step
from llm_svc.engine.model_runner import ModelRunner
from llm_svc.engine.models.config import (
    FULL,
    SLIDING,
    KVShape,
    TextModelConfig,
    UnsupportedModelError,
    sliding_layers,
)
from llm_svc.engine.parallel.checks import check_tensor_parallel
from llm_svc.engine.scheduler import ScheduledChunk
from llm_svc.engine.sequence import Sequence
from tests.llm_svc.checkpoints import CACHE_ROOT
from tests.llm_svc.conftest import greedy, make_engine, run_all, token_ids
from tests.llm_svc.family_checkpoints import VERSION, WINDOW, family_checkpoint

PAGE = 4


@pytest.fixture(scope="module")
def gemma4_dir():
    return family_checkpoint("gemma4_text")


def _config(model_dir, **overrides) -> EngineConfig:
    args = dict(page_size=PAGE, max_num_seqs=2, max_num_batched_tokens=8, device="cpu",
                dtype="float32", max_model_len=64)  # fmt: skip
    return EngineConfig(model_dir, **(args | overrides))


def test_the_config_reads_both_shapes_and_which_layers_reuse_kv(gemma4_dir):
    mc = TextModelConfig.from_model_dir(gemma4_dir)
    assert mc.kv_shape(SLIDING) == KVShape(2, 16)
    assert mc.kv_shape(FULL) == KVShape(1, 32)
    # Layers 4 (sliding) and 5 (full) read the last earlier layer of their kind.
    assert [mc.kv_source(i) for i in range(6)] == [0, 1, 2, 3, 2, 3]
    assert (mc.kv_layers(SLIDING), mc.kv_layers(FULL), mc.num_kv_layers) == ([0, 2], [1, 3], 4)
    assert mc.sliding_window == WINDOW and mc.final_logit_softcapping == 30.0


def test_kv_sharing_pairs_layers_as_transformers_does(gemma4_dir):
    import transformers as tf

    hf = tf.AutoConfig.from_pretrained(gemma4_dir)
    mc = TextModelConfig.from_model_dir(gemma4_dir)
    modes = hf.kv_sharing_modes
    for layer, mode in enumerate(modes):
        assert (mode == "reuse") == (mc.kv_source(layer) != layer)
        if mode == "reuse":
            kind = hf.layer_types[layer]
            stores = [i for i, m in enumerate(modes) if m == "store" and hf.layer_types[i] == kind]
            assert stores == [mc.kv_source(layer)]


def test_each_pool_has_its_kind_s_page_shape_and_shared_layers_hold_none(gemma4_dir):
    runner = ModelRunner(_config(gemma4_dir, num_pages=10))
    full, window = runner.kv_cache, runner.window_cache
    assert full.k.shape == (2, 10 * PAGE, 1, 32)  # layers 1 and 3
    assert window.k.shape == (2, 11 * PAGE, 2, 16)  # layers 0 and 2, and the null page
    assert runner.readers == {4: 2, 5: 3}
    per_layer = {
        kind: KVCache.bytes_per_page(1, PAGE, *runner._pool_shape(kind), torch.float32)
        for kind in (FULL, SLIDING)
    }
    assert per_layer == {FULL: 2 * PAGE * 32 * 4, SLIDING: 2 * PAGE * 2 * 16 * 4}
    assert runner.kv_bytes_per_page(runner.full_layers) == 2 * per_layer[FULL]
    assert runner.kv_bytes_per_page(runner.sliding_layers) == 2 * per_layer[SLIDING]
    assert runner.kv_bytes_per_page() == 2 * per_layer[FULL] + 2 * per_layer[SLIDING]


def test_the_byte_budget_splits_over_the_pages_of_layers_that_keep_kv(gemma4_dir):
    full_page = KVCache.bytes_per_page(2, PAGE, 1, 32, torch.float32)
    window_page = KVCache.bytes_per_page(2, PAGE, 2, 16, torch.float32)
    budget = 40 * full_page + 20 * window_page
    runner = ModelRunner(_config(gemma4_dir, kv_cache_bytes=budget))
    used = runner.num_pages * full_page + runner.num_window_pages * window_page
    assert budget - max(full_page, window_page) < used <= budget
    # Rule (a): one max_model_len sequence must fit; too small a budget names the pages.
    with pytest.raises(ValueError, match="max_model_len 64") as error:
        ModelRunner(_config(gemma4_dir, kv_cache_bytes=10 * full_page))
    assert f"full-attention pages of {full_page} bytes" in str(error.value)
    assert f"sliding-window pages of {window_page} bytes" in str(error.value)


def test_the_memory_profile_runs_on_both_pools(gemma4_dir):
    config = _config(gemma4_dir, num_pages=8, max_num_batched_tokens=20)
    runner = ModelRunner(config)
    backend = runner.backend
    step = profile_step(runner, config)
    pages = 2 * -(-10 // PAGE)  # 20 tokens over 2 sequences of 10
    assert step.kv_bytes == pages * runner.kv_bytes_per_page()
    assert (step.tokens, step.sampled_rows) == (20, 2)
    assert runner.backend is backend


def test_a_tied_head_with_soft_capped_logits_matches_hf(gemma4_dir):
    import transformers as tf

    from iris.models.text_tiny import build

    tied = build_atomically(
        CACHE_ROOT / f"gemma4_text-tied-{VERSION}",
        lambda out: build("gemma4_text", out, sliding_window=WINDOW, tie_word_embeddings=True),
    )
    runner = ModelRunner(_config(tied, num_pages=16))
    assert runner.model.lm_head is None
    ids = list(range(3, 3 + 3 * WINDOW + 5))
    seq = Sequence("tied", ids, SamplingParams(max_tokens=1))
    pages = -(-len(ids) // PAGE)
    seq.block_table, seq.window_table = list(range(pages)), list(range(1, pages + 1))
    ours = runner.execute(runner.prepare([ScheduledChunk(seq, 0, len(ids))]))[0]
    hf = tf.AutoModelForCausalLM.from_pretrained(tied, dtype=torch.float32).eval()
    hf.config.output_hidden_states = True  # transformers 5.24's bug: see test_families.py
    with torch.inference_mode():
        theirs = hf(torch.tensor([ids])).logits[0, -1]
    assert theirs.abs().max() < 30.0  # soft-capped
    torch.testing.assert_close(ours, theirs, atol=1e-4, rtol=0)


def _write(tmp_path, model_dir, **changes):
    config = json.loads((model_dir / "config.json").read_text())
    config.update(changes)
    (tmp_path / "config.json").write_text(json.dumps(config))
    return tmp_path


@pytest.mark.parametrize(
    ("changes", "needle"),
    [
        (dict(enable_moe_block=True), "enable_moe_block=true needs num_experts"),
        (dict(use_bidirectional_attention="all"), "use_bidirectional_attention='all'"),
        (dict(per_layer_config={"1": {"sliding_window": 4}}), "per_layer_config[1]"),
        (dict(per_layer_config={"0": {"head_dim": 8}}), "sliding layers of different shapes"),
        (dict(num_kv_shared_layers=6), "no earlier"),
        (dict(rope_parameters={"full_attention": {"rope_type": "yarn"}}), "'yarn'"),
        (dict(attn_logit_softcapping=50.0), "attn_logit_softcapping"),
    ],
)
def test_what_gemma4_does_not_serve_is_refused_by_name(tmp_path, gemma4_dir, changes, needle):
    with pytest.raises(UnsupportedModelError) as error:
        TextModelConfig.from_model_dir(_write(tmp_path, gemma4_dir, **changes))
    assert needle in str(error.value)


def test_a_hidden_size_per_layer_input_left_at_its_default_is_read_as_transformers_does(
    tmp_path, gemma4_dir
):
    config = json.loads((gemma4_dir / "config.json").read_text())
    for name in ("hidden_size_per_layer_input", "vocab_size_per_layer_input"):
        config.pop(name, None)  # transformers' defaults: 256 and 262,144
    (tmp_path / "config.json").write_text(json.dumps(config))
    mc = TextModelConfig.from_model_dir(tmp_path)
    assert (mc.per_layer_input_size, mc.per_layer_vocab_size) == (256, 262_144)


def test_tensor_parallelism_checks_each_layer_kind_s_kv_heads(tmp_path, gemma4_dir):
    # One global KV head (fewer than the ranks: replicated) and two sliding ones (split).
    check_tensor_parallel(gemma4_dir, 2, "cpu")
    with pytest.raises(ValueError, match="3 KV heads on its sliding layers"):
        check_tensor_parallel(_write(tmp_path, gemma4_dir, num_key_value_heads=3), 2, "cpu")


def test_triton_reads_both_shapes_and_the_shared_layers_kv_as_sdpa_does(monkeypatch, gemma4_dir):
    import iris_kernels

    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert iris_kernels.interpreting()
    prompts = [[(3 * i + n) % 40 + 3 for i in range(n)] for n in (5, 29)]
    results = {}
    for backend in ("triton", "sdpa"):
        engine = make_engine(gemma4_dir, max_num_batched_tokens=7, num_pages=32,
                             attention_backend=backend, dtype="float32", device="cpu")  # fmt: skip
        assert engine.runner.backend.full.name == engine.runner.backend.sliding.name == backend
        requests = {f"r{i}": (ids, greedy(4)) for i, ids in enumerate(prompts)}
        results[backend] = {rid: token_ids(out) for rid, out in run_all(engine, requests).items()}
        engine.close()
    assert results["triton"] == results["sdpa"]


def test_the_kv_shared_layers_run_on_the_sampled_rows_only(gemma4_dir):
    engine = make_engine(gemma4_dir, max_num_batched_tokens=16, dtype="float32", device="cpu")
    seen = []
    for layer in engine.runner.model.layers:
        layer.register_forward_hook(lambda module, args, out: seen.append(out.shape[0]))
    run_all(engine, {"a": (list(range(3, 23)), greedy(2))})  # 20 tokens: chunks of 16, 4
    engine.close()
    # Per step, four layers on every row, then the two KV-shared ones on the sampled rows;
    # the first chunk samples nothing, so they do not run at all.
    assert seen == [16] * 4 + [4] * 4 + [1, 1] + [1] * 6


def test_make_tiny_builds_it_and_the_registry_knows_it(tmp_path):
    from typer.testing import CliRunner

    from iris.cli import app
    from iris.models import load_adapter, text_family

    out = tmp_path / "g4"
    result = CliRunner().invoke(app, ["models", "make-tiny", "--arch", "gemma4_text", str(out)])
    assert result.exit_code == 0, result.output
    assert text_family("Gemma4ForCausalLM") == "gemma4"
    assert load_adapter(out).architecture == "Gemma4ForCausalLM"
    mc = TextModelConfig.from_model_dir(out)
    assert mc.kv_shape(FULL).head_dim > mc.kv_shape(SLIDING).head_dim
    assert mc.attention_k_eq_v and mc.kv_sources


@pytest.mark.parametrize(
    "keys",
    [
        dict(num_hidden_layers=7),  # the default 5 : 1 pattern
        dict(num_hidden_layers=3, layer_types=["full_attention"] + ["sliding_attention"] * 2),
    ],
)
def test_layer_kinds_follow_transformers_the_last_layer_always_full(keys):
    import transformers as tf

    hf = tf.Gemma4TextConfig(hidden_size_per_layer_input=0, **keys)
    ours = sliding_layers("Gemma4ForCausalLM", "gemma4", dict(keys))
    assert [kind == SLIDING for kind in ours] == [
        kind == "sliding_attention" for kind in hf.layer_types
    ]
    assert ours[-1] == FULL
