"""Gemma 4's per-layer embeddings and MoE block (llm_svc/engine/models/gemma4.py) beyond the
HF parity of test_families.py (which runs gemma4_text_ple and gemma4_text_moe through long
prompts in chunks smaller than the window, a prefix hit, preemption and a JSON constraint):

- the per-layer inputs equal transformers' `get_per_layer_inputs` + `project_per_layer_inputs`,
  also when some rows carry an embedding other than their token's (the image scatter of
  part 3: those rows take pad_token_id's table row and their own projection);
- the router picks the experts transformers' picks, with the same weights, on a batch built
  with near-ties (three experts whose router rows differ by 1e-6);
- the fused expert kernel (under the Triton interpreter) gives the grouped path's tokens;
- `iris models make-tiny` builds both variants; the CPU step-peak estimate counts the
  per-layer inputs and the routed experts.
Tensor parallelism: test_tensor_parallel_gemma4.py and test_tensor_parallel_gemma4_ple.py."""

from __future__ import annotations

import pytest
import torch

from llm_svc.engine.models.config import TextModelConfig
from tests.llm_svc.conftest import greedy, make_engine, run_all, token_ids
from tests.llm_svc.family_checkpoints import family_checkpoint

# How far apart the router rows of the near-tied experts are (each entry), and the largest
# gap between the k-th and (k+1)-th probability that counts as a near-tie.
ROW_MARGIN = 1e-6
TIE_GAP = 1e-5


@pytest.fixture(scope="module")
def ple_dir():
    return family_checkpoint("gemma4_text_ple")


@pytest.fixture(scope="module")
def moe_dir():
    return family_checkpoint("gemma4_text_moe")


def _hf(model_dir):
    import transformers as tf

    return tf.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()


def _engine(model_dir, **overrides):
    return make_engine(model_dir, dtype="float32", device="cpu", **overrides)


def test_per_layer_inputs_equal_transformers_also_for_scattered_rows(ple_dir):
    hf = _hf(ple_dir).model
    engine = _engine(ple_dir)
    ours = engine.runner.model
    mc = TextModelConfig.from_model_dir(ple_dir)
    assert mc.per_layer_input_size == 16 and mc.kv_sources  # with KV-shared layers
    torch.manual_seed(0)
    ids = torch.randint(3, mc.vocab_size, (12,))
    embeds = ours.embed(ids)
    # Rows 4..7 as an image would arrive: their own embedding, pad_token_id's table row.
    embeds[4:8] = torch.randn(4, mc.hidden_size) * 3
    ids[4:8] = mc.pad_token_id
    with torch.no_grad():
        got = ours.per_layer_inputs(ids, embeds)
        table = hf.get_per_layer_inputs(ids[None])
        want = hf.project_per_layer_inputs(embeds[None], table)[0]
    engine.close()
    assert got.shape == (12, mc.num_layers, 16)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-6)


def test_the_router_picks_transformers_experts_on_near_ties(moe_dir):
    hf = _hf(moe_dir).model.layers[0].router
    engine = _engine(moe_dir)
    ours = engine.runner.model.layers[0].router
    torch.manual_seed(0)
    with torch.no_grad():
        # Experts 1 and 2 route like expert 0 but for ROW_MARGIN: whenever the three lead,
        # the k-th and (k+1)-th probabilities are nearly tied.
        weight = ours.proj.weight.clone()
        for twin in (1, 2):
            weight[twin] = weight[0] + ROW_MARGIN * torch.randn_like(weight[0])
        ours.proj.weight.copy_(weight)
        hf.proj.weight.copy_(weight)
        x = torch.randn(256, weight.shape[1]) * 2
        x[:64] += 4 * weight[0] / weight[0].norm()  # rows led by the tied three
        probs, want_weights, want_experts = hf(x)
        got_weights, got_experts = ours(x)
    engine.close()
    top = probs.topk(ours.top_k + 1, dim=-1).values
    near_ties = int((top[:, -2] - top[:, -1] < TIE_GAP).sum())
    assert near_ties >= 16, f"only {near_ties} near-tied rows"
    assert torch.equal(got_experts, want_experts)
    torch.testing.assert_close(got_weights, want_weights, rtol=0, atol=1e-6)


def test_the_fused_expert_kernel_gives_the_grouped_path_s_tokens(monkeypatch, moe_dir):
    import iris_kernels

    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert iris_kernels.interpreting()
    prompts = {f"r{i}": ([(5 * j + n) % 40 + 3 for j in range(n)], greedy(3)) for i, n in
               enumerate((6, 13))}  # fmt: skip
    results = []
    for fused in (False, True):
        engine = _engine(moe_dir, max_num_batched_tokens=8)
        for layer in engine.runner.model.layers:
            layer.experts.fused = fused
        results.append({rid: token_ids(out) for rid, out in run_all(engine, prompts).items()})
        engine.close()
    assert results[0] == results[1]


@pytest.mark.parametrize("arch", ["gemma4_text_ple", "gemma4_text_moe"])
def test_make_tiny_builds_both_variants(tmp_path, arch):
    from typer.testing import CliRunner

    from iris.cli import app

    out = tmp_path / arch
    result = CliRunner().invoke(app, ["models", "make-tiny", "--arch", arch, str(out)])
    assert result.exit_code == 0, result.output
    mc = TextModelConfig.from_model_dir(out)
    if arch == "gemma4_text_ple":
        assert mc.per_layer_input_size and mc.kv_sources and mc.moe is None
    else:
        assert mc.moe.num_experts == 8 and mc.moe.top_k == 2 and mc.attention_k_eq_v
        assert mc.kv_shape("full").num_kv_heads == 1


def test_the_cpu_step_peak_counts_per_layer_inputs_and_routed_experts(ple_dir, moe_dir):
    from llm_svc.engine.memory_budget import estimated_step_peak

    ple, moe = TextModelConfig.from_model_dir(ple_dir), TextModelConfig.from_model_dir(moe_dir)
    assert ple.step_extra_width == 3 * 6 * 16  # projection, table rows, sum: 6 layers x 16
    assert moe.step_extra_width == 2 * (2 * 64 + 3 * 32)  # top 2 of experts 32 wide
    base = estimated_step_peak(64, 128, 448, 16, 2, torch.float32)
    more = estimated_step_peak(64, 128, 448, 16, 2, torch.float32, extra_width=100)
    assert more - base == 16 * 100 * 4
