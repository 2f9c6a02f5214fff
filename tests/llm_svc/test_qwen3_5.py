"""Qwen3.5's hybrid decoder in the engine (Gated DeltaNet states in the StatePool, snapshots
in the prefix cache) against transformers' Qwen3_5ForCausalLM in float32, with its own torch
fallbacks for the gated delta rule (fla is not importable: test_gated_deltanet.py)."""

from __future__ import annotations

import json

import jsonschema
import pytest
import torch

from iris.multimodal import PrefixResumeRule
from llm_svc.engine import BlockRemoved, SamplingParams
from llm_svc.engine.grammar import Constraint, ConstraintKind
from tests.llm_svc.checkpoints import tiny_checkpoint
from tests.llm_svc.conftest import greedy, make_engine, run_all, token_ids

PAGE, K = 4, 2  # snapshots every 2 pages = 8 tokens
PROMPTS = [
    "The capital of France is Paris. A cat sat on the mat; the dog ran",
    "hello world, how are you today? I am fine",
]
NEW_TOKENS = 10


@pytest.fixture(scope="module")
def model_dir():
    return tiny_checkpoint("qwen3_5")


class HFGreedy:
    """HF generate's greedy tokens and, from one forward over the whole text, their
    log-probabilities; memoised per (prompt, new tokens)."""

    def __init__(self, model_dir) -> None:
        import transformers as tf

        # Qwen3_5ForCausalLM or Qwen3_5MoeForCausalLM, as config.json names it.
        self.model = tf.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
        self.model.eval()
        self.memo: dict = {}

    def __call__(self, prompt: list[int], new_tokens: int) -> tuple[list[int], list[float]]:
        key = (tuple(prompt), new_tokens)
        if key not in self.memo:
            self.memo[key] = self._run(prompt, new_tokens)
        return self.memo[key]

    @torch.inference_mode()
    def _run(self, prompt: list[int], new_tokens: int):
        ids = torch.tensor([prompt])
        out = self.model.generate(
            ids, attention_mask=torch.ones_like(ids), max_new_tokens=new_tokens,
            min_new_tokens=new_tokens, do_sample=False,
        )  # fmt: skip
        logits = self.model(out).logits[0].float().log_softmax(-1)
        tokens = out[0, len(prompt) :].tolist()
        rows = range(len(prompt) - 1, len(prompt) - 1 + new_tokens)
        return tokens, [logits[row, token].item() for row, token in zip(rows, tokens, strict=True)]


@pytest.fixture(scope="module")
def hf_model(model_dir):
    return HFGreedy(model_dir)


def _engine(model_dir, **overrides):
    args = dict(page_size=PAGE, state_snapshot_interval=K)
    return make_engine(model_dir, **(args | overrides))


def _ids(engine, text: str) -> list[int]:
    return engine.tokenizer(text)["input_ids"]


def _logprobs(outputs) -> list[float]:
    return [entry.logprob for out in outputs for entry in out.new_logprobs]


def _check(engine, hf_model, prompts: list[list[int]], new_tokens: int = NEW_TOKENS):
    params = greedy(new_tokens, logprobs=0)
    outputs = run_all(engine, {str(i): (p, params) for i, p in enumerate(prompts)})
    for i, prompt in enumerate(prompts):
        tokens, logprobs = hf_model(prompt, new_tokens)
        assert token_ids(outputs[str(i)]) == tokens, f"prompt {i}"
        assert _logprobs(outputs[str(i)]) == pytest.approx(logprobs, abs=1e-4), f"prompt {i}"
    return outputs


@pytest.mark.parametrize("budget", [1, 7, 64])
def test_greedy_tokens_and_logprobs_match_hf(model_dir, hf_model, budget):
    engine = _engine(model_dir, max_num_batched_tokens=budget)
    _check(engine, hf_model, [_ids(engine, text) for text in PROMPTS])


def test_greedy_matches_hf_under_preemption(model_dir, hf_model):
    # 12 pages of 4 tokens cannot hold two ~28-token sequences and a third at once.
    engine = _engine(model_dir, num_pages=12, max_num_batched_tokens=16)
    prompts = [_ids(engine, text + " and then") for text in [*PROMPTS, PROMPTS[0][:30]]]
    _check(engine, hf_model, prompts, new_tokens=12)
    assert engine.stats().preemptions > 0
    pool = engine.runner.state_pool
    assert len(pool._free_running) == pool.running_slots  # every running slot given back


def test_json_constrained_request_is_valid_and_the_same_from_a_prefix_hit(model_dir):
    schema = {
        "type": "object",
        "properties": {"name": {"type": "string", "maxLength": 6}, "n": {"type": "integer"}},
        "required": ["name", "n"],
        "additionalProperties": False,
    }
    constraint = Constraint(ConstraintKind.JSON_SCHEMA, json.dumps(schema))
    params = SamplingParams(temperature=0.0, max_tokens=60, ignore_eos=True, constraint=constraint)
    engine = _engine(model_dir, max_num_batched_tokens=5)
    results = []
    for _ in range(2):  # cold in chunks of 5, then a prefix hit
        outs = run_all(engine, {"json": (_ids(engine, PROMPTS[0]), params)})["json"]
        assert outs[-1].finish_reason == "stop"
        jsonschema.validate(json.loads("".join(out.new_text for out in outs)), schema)
        results.append((token_ids(outs), outs[-1].num_cached_tokens))
    engine.close()
    assert results[0][0] == results[1][0]
    assert results[1][1] > 0


@pytest.mark.parametrize(("shared", "expected_hit"), [(0, 0), (4, 0), (8, 8), (11, 8)])
def test_prefix_hit_resumes_from_the_deepest_snapshot(model_dir, hf_model, shared, expected_hit):
    """A second request sharing `shared` tokens of the first: 0, 1 page, k pages, k pages
    + 3 tokens. It resumes from the deepest snapshot (every k pages) and answers as cold."""
    engine = _engine(model_dir, max_num_batched_tokens=64)
    first = _ids(engine, PROMPTS[0])
    other = _ids(engine, "0123456789 + - = ? ! hello world, the quick brown fox")
    assert first[shared] != other[shared]
    second = first[:shared] + other[shared:]
    run_all(engine, {"first": (first, greedy(4))})
    rule = PrefixResumeRule(PAGE, engine.model_config.resume_layers(K))
    predicted = rule.resumable_tokens(len(second), held_blocks=shared // PAGE)
    assert predicted == expected_hit
    outputs = _check(engine, hf_model, [second])
    assert outputs["0"][-1].num_cached_tokens == expected_hit


def test_next_turn_resumes_after_the_previous_answer(model_dir, hf_model):
    # Decode takes snapshots too: the answer's boundaries are resumable.
    engine = _engine(model_dir, max_num_batched_tokens=64)
    first = _ids(engine, PROMPTS[1])
    answer = token_ids(run_all(engine, {"turn1": (first, greedy(12))})["turn1"])
    second = first + answer + _ids(engine, " and the dog")
    outputs = _check(engine, hf_model, [second], new_tokens=6)
    expected = (len(first) + len(answer) - 1) // (PAGE * K) * (PAGE * K)
    assert expected > len(first)
    assert outputs["0"][-1].num_cached_tokens == expected


def test_snapshots_are_evicted_with_their_nodes(model_dir, hf_model):
    """A cache too small for every prompt: nodes go, their snapshot slots come back, and
    what is hit is still right."""
    engine = _engine(model_dir, num_pages=10, max_num_batched_tokens=32, max_num_seqs=2)
    pool, cache = engine.runner.state_pool, engine.blocks.cache
    texts = [*PROMPTS, "0123456789 + - = ? ! the quick brown fox jumps over the dog"]
    prompts = [_ids(engine, text) for text in texts]
    for i, prompt in enumerate(prompts * 2):
        _check(engine, hf_model, [prompt], new_tokens=3)
        nodes = list(cache._nodes())
        held = [node.snapshot for node in nodes if node.snapshot is not None]
        assert len(set(held)) == len(held), f"round {i}: a slot on two nodes"
        assert pool.num_free_snapshots + len(held) == pool.snapshot_slots, f"round {i}"
    assert engine.stats().snapshots_skipped == 0  # slots were freed by evicting, not skipped
    assert any(isinstance(event, BlockRemoved) for event in engine.take_kv_events())


def test_make_tiny_qwen3_5_is_served_as_hf_runs_it(tmp_path):
    from typer.testing import CliRunner

    from iris.cli import app
    from llm_svc.engine.spec.mtp import mtp_layer_count

    target = tmp_path / "tiny-qwen3_5"
    result = CliRunner().invoke(app, ["models", "make-tiny", "--arch", "qwen3_5", str(target)])
    assert result.exit_code == 0, result.output
    engine = _engine(target)
    assert engine.model_config.layer_types == ("linear",) * 3 + ("full",)
    assert engine.model_config.rotary_dim == 4  # partial_rotary_factor 0.25 of head_dim 16
    # make-tiny writes one random MTP layer (transformers ignores it; read from the tensors).
    assert mtp_layer_count(target) == 1
    _check(engine, HFGreedy(target), [_ids(engine, "hello world, how are you")], new_tokens=5)


def test_make_tiny_qwen3_5_moe_is_served_as_hf_runs_it(tmp_path):
    """Qwen3_5MoeForCausalLM: every layer's MLP is the experts plus the gated shared
    expert; chunks of 5 and a prefix hit from a snapshot answer as HF does."""
    from typer.testing import CliRunner

    from iris.cli import app
    from llm_svc.engine.models.moe import SparseMoE

    target = tmp_path / "tiny-qwen3_5_moe"
    args = ["models", "make-tiny", "--arch", "qwen3_5_moe", str(target)]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    engine = _engine(target, max_num_batched_tokens=5)
    assert engine.model_config.family == "qwen3_5_moe"
    layers = engine.runner.model.layers
    assert all(isinstance(layer.mlp, SparseMoE) for layer in layers)
    assert all(layer.mlp.shared_expert is not None for layer in layers)
    hf = HFGreedy(target)
    prompt = _ids(engine, PROMPTS[0])
    _check(engine, hf, [prompt], new_tokens=6)
    outputs = _check(engine, hf, [prompt], new_tokens=6)  # again: a prefix hit
    assert outputs["0"][-1].num_cached_tokens >= PAGE * K


def test_the_budget_pays_for_running_states_and_one_snapshot_per_k_pages(model_dir):
    from llm_svc.engine import EngineConfig
    from llm_svc.engine.kv_sizing import profile_step
    from llm_svc.engine.model_runner import ModelRunner
    from llm_svc.engine.state_pool import StatePool

    budget = 4 << 20
    config = EngineConfig(model_dir, page_size=PAGE, max_num_seqs=6, kv_cache_bytes=budget,
                          state_snapshot_interval=K, device="cpu", dtype="float32")  # fmt: skip
    runner = ModelRunner(config)
    mc, pool = runner.model_config, runner.state_pool
    slot = StatePool.bytes_per_slot(mc.linear, mc.num_linear_layers)
    per_page = runner.kv_bytes_per_page()
    assert per_page == 2 * 1 * PAGE * mc.num_kv_heads * mc.head_dim * 4  # one full layer
    assert pool.running_slots == 6
    assert runner.num_pages == (budget - 6 * slot) * K // (per_page * K + slot)
    assert pool.snapshot_slots == runner.num_pages // K
    used = runner.num_pages * per_page + (pool.running_slots + pool.snapshot_slots) * slot
    assert budget - per_page - slot < used <= budget
    assert pool.recurrent.dtype == torch.float32 and pool.conv.dtype == torch.float32
    # The memory profile's step gives its sequences slots of its own, then puts the pool back.
    step = profile_step(runner, config)
    assert step.sampled_rows == 6 and runner.state_pool is pool
