"""Speculative decoding in the engine (llm_svc/engine/spec): greedy tokens with drafts
equal greedy tokens without, token for token, for every family served and both proposers
(the oracle, which proposes the true continuation with probability 0.6, and n-gram), in
one run that holds chunked prefill, preemption, drafts cut by the token budget, images
(the VLM layouts) and then a prefix hit; seeded sampling with drafts keeps the
distribution of the tokens without them (a chi-square test on fixed seeds) and is
reproducible; the scheduling rules; no page leaks and no unaccepted token cached."""

from __future__ import annotations

import pytest

from llm_svc.engine import EngineConfig, LLMEngine, VisionEmbeddingSource
from llm_svc.engine.spec import NgramProposer, OracleProposer
from tests.llm_svc.conftest import _checkpoint, greedy
from tests.llm_svc.family_checkpoints import FAMILIES, family_checkpoint
from tests.llm_svc.mm_reference import GatedSource, MMReference, admit_together, make_image

PAGE, CHUNK, NEW, K = 4, 7, 10, 3
TEXTS = [
    "The quick brown fox jumps over the lazy dog. The quick brown fox",
    "hello world, how are you today?",
    "A cat sat on the mat; the dog ran to the park. A cat sat on the",
]
VLMS = ("idefics3", "qwen2_vl")
KINDS = ["llama", "qwen2", "qwen3_5", *VLMS, *sorted(FAMILIES)]


def _prompts(kind: str, model_dir):
    """(ids, items, images) per prompt; a VLM's hold one image each."""
    if kind not in VLMS:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
        return [(tokenizer(text)["input_ids"], [], []) for text in TEXTS]
    reference = MMReference(model_dir)
    prompts = []
    for seed, text in enumerate(TEXTS):
        prompt = reference.prompt([text[:20], text[20:]], [make_image(seed)])
        prompts.append((prompt.padded, prompt.items, prompt.images))
    return prompts


def _serve(model_dir, prompts, proposer=None, **spec) -> tuple[dict, dict, LLMEngine]:
    """Tokens of the prompts run together (pages for one and a bit: preemption), then
    again, newest first (a prefix hit), by one engine; `proposer(engine)` replaces its proposer."""
    longest = max(len(ids) for ids, _, _ in prompts) + NEW
    config = EngineConfig(
        model_dir, page_size=PAGE, max_num_batched_tokens=CHUNK, max_num_seqs=4,
        num_pages=-(-longest // PAGE) + 4, device="cpu", dtype="float32",
        state_snapshot_interval=1, **spec,
    )  # fmt: skip
    source = vision = None
    if prompts[0][1]:
        vision = VisionEmbeddingSource(MMReference(model_dir).adapter.vision_runner())
        source = GatedSource(vision)
        for _, items, images in prompts:
            for item, image in zip(items, images, strict=True):
                vision.register(item.key, image)
    engine = LLMEngine(config, embedding_source=source)
    if proposer is not None:
        engine.speculator.proposer = proposer(engine)
    runs = []
    for order in (1, -1):  # again newest first: the pages cached last are the ones left
        for index, (ids, items, _) in list(enumerate(prompts))[::order]:
            engine.add_request(f"r{index}", ids, greedy(NEW), items=items)
        if source is not None and order == 1:
            admit_together(engine, source)  # the gate stays open for the second pass
        tokens = {f"r{index}": [] for index in range(len(prompts))}
        while engine.has_unfinished():
            for out in engine.step():
                tokens[out.request_id] += out.new_token_ids
        runs.append(tokens)
    return runs[0], runs[1], engine


def _check_pages(engine, prompts, tokens) -> None:
    """Every page is back (free or cached), and each cached chain is a prefix of a
    request's prompt and accepted output."""
    blocks = engine.blocks
    assert blocks.num_available == blocks.num_pages
    if blocks.windows is not None:
        assert blocks.windows.num_available == blocks.windows.num_pages - 1
    full = [ids + tokens[f"r{i}"] for i, (ids, _, _) in enumerate(prompts)]
    for node in list(blocks.cache._nodes()):
        chain = []
        while node is not None and node.key is not None:
            chain[:0] = node.key
            node = node.parent
        assert any(seq[: len(chain)] == chain for seq in full), "a cached draft"


@pytest.fixture(scope="module", params=KINDS)
def family(request):
    kind = request.param
    model_dir = family_checkpoint(kind) if kind in FAMILIES else _checkpoint(request, kind)
    prompts = _prompts(kind, model_dir)
    first, again, engine = _serve(model_dir, prompts)
    assert engine.stats().preemptions > 0
    return kind, model_dir, prompts, first, again


def test_greedy_with_drafts_equals_greedy_without(family):
    kind, model_dir, prompts, first, again = family
    assert first == again
    oracle = lambda engine: OracleProposer(first, 0.6, engine.model_config.vocab_size)  # noqa: E731
    # n from 4 down to 1: a random model seldom repeats 2 tokens, so n = 1 makes it draft.
    ngram = lambda engine: NgramProposer(engine.model_config.vocab_size, min_n=1)  # noqa: E731
    for name, proposer in (("oracle", oracle), ("ngram", ngram)):
        spec_first, spec_again, engine = _serve(
            model_dir, prompts, proposer, num_speculative_tokens=K,
            speculative_min_acceptance=0.0,
        )  # fmt: skip
        assert spec_first == first, f"{kind} {name}"
        assert spec_again == first, f"{kind} {name} from the prefix cache"
        stats = engine.speculator.stats
        if name == "oracle":
            assert 0 < stats.accepted["oracle"] < stats.proposed["oracle"], "accepts and rejects"
        assert engine.stats().prefix_hit_tokens > 0
        _check_pages(engine, prompts, first)
