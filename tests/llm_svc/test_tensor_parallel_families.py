"""Tensor parallelism (gloo, two CPU ranks) for the MoE families and Gemma 3: TP 2 gives
TP 1's greedy tokens and log-probs, through chunked prefill, a prefix-cache hit,
preemption and a JSON-constrained request, with the sliding layers' pages in their window
pool on every rank, freed as they leave the window; router decisions (recorded on rank 0,
whose router input is the all-reduced hidden state every rank shares) may differ only at
near-ties of the top-k boundary, counted and printed (tp_compare.py)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from llm_svc.engine import EngineConfig, LLMEngine, SamplingParams
from llm_svc.engine.grammar import Constraint, ConstraintKind
from llm_svc.engine.models.moe import Router
from tests.llm_svc.family_checkpoints import family_checkpoint
from tests.llm_svc.test_families import LONG, SHORT
from tests.llm_svc.tp_compare import compare_routers, compare_runs

PAGE, CHUNK, NEW = 4, 5, 6


def _params() -> list[SamplingParams]:
    greedy = dict(temperature=0.0, max_tokens=NEW, ignore_eos=True, logprobs=2)
    json = Constraint(ConstraintKind.JSON_OBJECT, "")
    return [SamplingParams(**greedy), SamplingParams(**greedy, constraint=json)] + [
        SamplingParams(**greedy)
    ]


def _run(engine, batch) -> list[SimpleNamespace]:
    for index, (ids, params) in enumerate(batch):
        engine.add_request(f"r{index}", ids, params)
    results = [SimpleNamespace(token_ids=[], logprobs=[], cached=0) for _ in batch]
    while engine.has_unfinished():
        for out in engine.step():
            result = results[int(out.request_id[1:])]
            result.token_ids += out.new_token_ids
            result.logprobs += out.new_logprobs
            result.cached = out.num_cached_tokens
    return results


@pytest.fixture(scope="module", params=["qwen3_moe", "qwen2_moe", "gemma3_text"])
def runs(request):
    model_dir = family_checkpoint(request.param)
    decisions: list = []
    original = Router.forward

    def recording(self, x):
        weights, experts = original(self, x)
        probs = torch.softmax(torch.nn.functional.linear(x, self.weight).float(), dim=-1)
        top = probs.topk(self.top_k + 1, dim=-1).values
        decisions.append((experts.sort(dim=-1).values, (top[:, -2] - top[:, -1]).tolist()))
        return weights, experts

    Router.forward = recording
    results = {}
    try:
        for size in (1, 2):
            config = EngineConfig(
                model_dir, page_size=PAGE, max_num_batched_tokens=CHUNK, num_pages=20,
                max_num_seqs=4, dtype="float32", device="cpu", tensor_parallel_size=size,
            )  # fmt: skip
            engine = LLMEngine(config)
            try:
                engine.grammars.submit(_params()[1].constraint).result(timeout=120)
                ids = [engine.tokenizer(text)["input_ids"] for text in (LONG, SHORT, LONG)]
                batch = list(zip([ids[0], ids[1], ids[2][2:]], _params(), strict=True))
                decisions.clear()
                first = _run(engine, batch)
                again = _run(engine, batch[:1])
                windows = engine.blocks.windows
                pool = (windows.num_pages, windows.peak_held, len(ids[0]))
                results[size] = (first, again, list(decisions), engine.stats(), pool)
            finally:
                engine.close()
    finally:
        Router.forward = original
    yield request.param, results


def test_tp2_equals_tp1(runs):
    arch, results = runs
    first1, again1, routers1, stats1, pool1 = results[1]
    first2, again2, routers2, stats2, pool2 = results[2]
    flips = compare_runs(first1, first2, arch) + compare_runs(again1, again2, f"{arch} again")
    router_flips = compare_routers(routers1, routers2, arch)
    print(f"\n{arch}: {len(flips)} near-tie flip(s), {len(router_flips)} router flip(s)")
    assert stats1.preemptions > 0 and stats2.preemptions > 0
    assert again1[0].cached > 0 and again2[0].cached > 0
    # Both runs kept the sliding layers' KV in the window pool, and pages left it: the
    # most one sequence held is below the long prompt's pages (the window is 8 tokens).
    window_pages, peak, long_tokens = pool2
    assert pool1 == pool2 and window_pages == 21  # num_pages + the null page
    assert 0 < peak < -(-long_tokens // PAGE), pool2
    if arch != "gemma3_text":
        assert routers1
