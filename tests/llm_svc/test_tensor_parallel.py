"""Tensor parallelism on the CPU with real rank processes (gloo, two ranks): TP 2 gives TP
1's greedy tokens, log-probs and seeded samples, in float32, for a plain LM and the tiny
VLM families with images (InternVL aside: see `runs`), through one run that holds chunked
prefill cutting an image, a prefix-cache hit, preemption, a JSON-constrained request and
seeded sampling. Flips are allowed only at near-ties (tp_compare.py) and printed. One
engine per model and size, shared by the module."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from llm_svc.engine import EngineConfig, LLMEngine, SamplingParams, VisionEmbeddingSource
from llm_svc.engine.grammar import Constraint, ConstraintKind
from tests.llm_svc.conftest import _checkpoint
from tests.llm_svc.mm_reference import GatedSource, MMReference, admit_together, make_image
from tests.llm_svc.tp_compare import compare_runs

PAGE, CHUNK, NEW = 4, 5, 8
TEXTS = [
    ["The quick brown fox jumps over"],
    ["hello world, how are you today?", "I am fine"],
    ["The capital of France is Paris. A cat sat on the mat;", "the dog ran"],
]


def _prompts(kind, model_dir):
    """(ids as the engine takes them, items, images) per prompt; VLM prompts hold one
    image each (its sentinels in the ids)."""
    if kind == "llama":
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(str(model_dir))
        return [(tok(" ".join(parts))["input_ids"], [], []) for parts in TEXTS]
    reference = MMReference(model_dir)
    prompts = []
    for seed, parts in enumerate(TEXTS):
        parts = parts if len(parts) == 2 else [*parts, "now"]
        prompt = reference.prompt(parts, [make_image(seed)])
        prompts.append((prompt.padded, prompt.items, prompt.images))
    return prompts


def _params():
    greedy = dict(temperature=0.0, max_tokens=NEW, ignore_eos=True, logprobs=2)
    json = Constraint(ConstraintKind.JSON_OBJECT, "")
    return [
        SamplingParams(**greedy),
        SamplingParams(**greedy),
        SamplingParams(**greedy),
        SamplingParams(**greedy, constraint=json),
        SamplingParams(**(greedy | dict(temperature=1.0, seed=7))),
    ]


def _run(engine, source, batch) -> list[SimpleNamespace]:
    """Add `batch` ((ids, items, params) each) at once, admit it together, run it out."""
    for index, (ids, items, params) in enumerate(batch):
        engine.add_request(f"r{index}", ids, params, items=items)
    if source is not None:
        admit_together(engine, source)
    results = [SimpleNamespace(token_ids=[], logprobs=[], cached=0) for _ in batch]
    while engine.has_unfinished():
        for out in engine.step():
            result = results[int(out.request_id[1:])]
            result.token_ids += out.new_token_ids
            result.logprobs += out.new_logprobs
            result.cached = out.num_cached_tokens
    return results


def _engine(model_dir, prompts, size: int):
    """An engine of `size` ranks, with an in-process vision tower behind a gate for VLMs."""
    longest = max(len(ids) for ids, _, _ in prompts) + NEW
    config = EngineConfig(
        model_dir,
        page_size=PAGE,
        max_num_batched_tokens=CHUNK,
        # Room for one request and a bit: the others are preempted and re-prefilled.
        num_pages=-(-longest // PAGE) + 4,
        max_num_seqs=5,
        dtype="float32",
        device="cpu",
        tensor_parallel_size=size,
        # A hybrid model's (Qwen3.5) states are snapshot every page, so a hit resumes.
        state_snapshot_interval=1,
    )
    source = None
    if prompts[0][1]:
        vision = VisionEmbeddingSource(MMReference(model_dir).adapter.vision_runner())
        for _, items, images in prompts:
            for item, image in zip(items, images, strict=True):
                vision.register(item.key, image)
        source = GatedSource(vision)
    engine = LLMEngine(config, embedding_source=source)
    # Compiled before the run, so the step the constrained request joins at is fixed.
    engine.grammars.submit(_params()[3].constraint).result(timeout=120)
    return engine, source


# Qwen3.5-MoE's VLM runs here: the hybrid decoder (linear-attention heads and state pools
# split, snapshots resumed on every rank) with experts and images; the dense Qwen3.5 text
# model has its own TP test against HF (test_tensor_parallel_hybrid.py).
# Mistral 3 runs here (its images are many spans, one per row, broken by text tokens); InternVL
# does not: under TP it adds nothing the others do not hold. Its images reach the engine as
# embeddings like Qwen2-VL's (one contiguous span each) and its language model is Qwen3,
# whose attention (q/k norms) runs under TP in test_tensor_parallel_families.py's Qwen3-MoE;
# its TP 2 run took ~80 s of the suite's 2 cores.
@pytest.fixture(
    scope="module", params=["llama", "qwen2_vl", "idefics3", "mistral3", "qwen3_5_vl_moe"]
)
def runs(request):
    """{size: (first batch, the first prompt again, stats, runner)} of one model, and the
    lengths of its image spans."""
    kind = request.param
    model_dir = _checkpoint(request, kind)
    prompts = _prompts(kind, model_dir)
    batch = [*prompts, prompts[0], prompts[1]]
    batch = [(ids, items, params) for (ids, items, _), params in zip(batch, _params(), strict=True)]
    results = {}
    for size in (1, 2):
        engine, source = _engine(model_dir, prompts, size)
        try:
            first = _run(engine, source, batch)
            if source is not None:
                source.gate.clear()
            again = _run(engine, source, batch[:1])
            results[size] = (first, again, engine.stats(), engine.runner)
        finally:
            engine.close()
    spans = [end - start + 1 for _, items, _ in prompts for i in items for start, end in i.offsets]
    yield kind, results, spans


def test_tp2_equals_tp1(runs):
    kind, results, spans = runs
    (first1, again1, stats1, _), (first2, again2, stats2, runner2) = results[1], results[2]
    flips = compare_runs(first1, first2, kind) + compare_runs(again1, again2, f"{kind} again")
    print(f"\n{kind}: {len(flips)} near-tie flip(s) {flips}")
    # What the run held, in both sizes.
    for stats in (stats1, stats2):
        assert stats.preemptions > 0
    assert again1[0].cached > 0 and again2[0].cached > 0
    if spans:
        assert max(spans) > CHUNK  # a chunk of CHUNK tokens cuts an image span
    # One set of pages: each rank holds one of the two KV heads of every page.
    assert stats2.num_pages == stats1.num_pages
    assert runner2.kv_cache.k.shape[2] == 1
