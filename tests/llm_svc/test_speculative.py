"""Speculative decoding in the engine (llm_svc/engine/spec): greedy tokens with drafts
equal greedy tokens without, token for token, for every family served and both proposers
(the oracle, which proposes the true continuation with probability 0.6, and n-gram), in
one run that holds chunked prefill, preemption, drafts cut by the token budget, images
(the VLM layouts) and then a prefix hit; seeded sampling with drafts keeps the
distribution of the tokens without them (a chi-square test on fixed seeds) and is
reproducible; the scheduling rules; no page leaks and no unaccepted token cached."""

from __future__ import annotations

import pytest

from llm_svc.engine import EngineConfig, LLMEngine, SamplingParams, VisionEmbeddingSource
from llm_svc.engine.spec import NgramProposer, OracleProposer
from tests.llm_svc.checkpoints import mtp_checkpoint, tiny_checkpoint
from tests.llm_svc.conftest import _checkpoint, greedy, make_engine, run_all, token_ids
from tests.llm_svc.family_checkpoints import FAMILIES, family_checkpoint
from tests.llm_svc.mm_reference import GatedSource, MMReference, admit_together, make_image

PAGE, CHUNK, NEW, K = 4, 7, 8, 3
TEXTS = [
    "The quick brown fox jumps over the lazy dog. The quick brown fox",
    "hello world, how are you today?",
    "A cat sat on the mat; the dog ran to the park. A cat sat on the",
]
# The VLM layouts, by their shared tiny checkpoints' fixtures (tests/fixtures/models.py).
VLMS = {
    "idefics3": "tiny_idefics3_dir", "qwen2_vl": "tiny_qwen2_vl_dir",
    "gemma3": "tiny_gemma3_dir", "gemma4": "tiny_gemma4_dir",
    "qwen3_5_vl_moe": "tiny_qwen3_5_vl_moe_dir",
}  # fmt: skip
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
    chunk, adapter = CHUNK, None
    if prompts[0][1]:
        adapter = MMReference(model_dir).adapter
        if adapter.bidirectional_image_spans:  # Gemma 3 and 4: a span is one chunk
            chunk = max(chunk, adapter.max_uncut_span)
    config = EngineConfig(
        model_dir, page_size=PAGE, max_num_batched_tokens=chunk, max_num_seqs=4,
        num_pages=-(-longest // PAGE) + 4, device="cpu", dtype="float32",
        state_snapshot_interval=1, **spec,
    )  # fmt: skip
    source = vision = None
    if adapter is not None:
        vision = VisionEmbeddingSource(adapter.vision_runner())
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
    if kind in VLMS:
        model_dir = request.getfixturevalue(VLMS[kind])
    else:
        model_dir = family_checkpoint(kind) if kind in FAMILIES else _checkpoint(request, kind)
    prompts = _prompts(kind, model_dir)
    first, again, engine = _serve(model_dir, prompts)
    # Gemma 4's image span (70 tokens) is one chunk: its prompts then run one after another.
    assert engine.stats().preemptions > 0 or kind == "gemma4"
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


@pytest.mark.parametrize("arch", ["qwen3_5", "qwen3_5_moe"])
def test_greedy_with_mtp_drafts_equals_greedy_without(arch):
    """The MTP proposer on make-tiny's checkpoints (their random MTP layer: mechanics, not
    acceptance), through the same run: chunked prefill, preemption, a prefix hit."""
    model_dir = mtp_checkpoint(arch)
    prompts = _prompts(arch, model_dir)
    first, _, _ = _serve(model_dir, prompts)
    spec_first, spec_again, engine = _serve(
        model_dir, prompts, num_speculative_tokens=K, speculative_method="mtp",
        speculative_min_acceptance=0.0,
    )  # fmt: skip
    assert spec_first == first and spec_again == first
    stats = engine.stats()
    assert stats.spec_proposed["mtp"] > 0 and stats.spec_verifications["mtp"] > 0
    assert engine.speculator.proposer.states == {}  # finished sequences are forgotten
    _check_pages(engine, prompts, first)


# --- sampling ---------------------------------------------------------------------------
SEEDS = 240


def _critical(dof: int) -> float:
    """The chi-square value exceeded with probability 0.001 at `dof` degrees of freedom
    (Wilson and Hilferty's approximation: within 3% of the exact value)."""
    z, h = 3.0902, 2 / (9 * dof)
    return dof * (1 - h + z * h**0.5) ** 3


def _sampled(engine, prompt: list[int]) -> dict[str, list[int]]:
    params = [
        SamplingParams(temperature=1.0, top_k=3, max_tokens=3, ignore_eos=True, seed=seed)
        for seed in range(SEEDS)
    ]
    return {
        request_id: token_ids(outs)
        for request_id, outs in run_all(
            engine, {f"s{seed}": (prompt, p) for seed, p in enumerate(params)}
        ).items()
    }


def _homogeneity(first: list[tuple], second: list[tuple]) -> tuple[float, int]:
    """Two-sample chi-square statistic over the outcomes, those expected fewer than 5
    times in either sample pooled into one cell; and its degrees of freedom."""
    cells = sorted(set(first) | set(second))
    counts = [(first.count(cell), second.count(cell)) for cell in cells]
    big = [pair for pair in counts if sum(pair) >= 10]
    rest = [sum(a for a, _ in counts if (a, _) not in big)]
    rest.append(sum(b for a, b in counts if (a, b) not in big))
    table = big + ([tuple(rest)] if sum(rest) else [])
    stat = 0.0
    for a, b in table:
        for observed in (a, b):
            expected = (a + b) / 2  # equal sample sizes
            stat += (observed - expected) ** 2 / expected
    return stat, len(table) - 1


@pytest.fixture(scope="module")
def sampled():
    """Seeded samples (top-k 3) of one prompt without drafts, with them (the oracle
    proposing the greedy continuation, so drafts are both accepted and rejected), and
    with them again."""
    model_dir = tiny_checkpoint("llama")
    prompt = list(range(10, 30))
    base = make_engine(model_dir, max_num_seqs=64)
    without = _sampled(base, prompt)
    truth = token_ids(run_all(base, {"g": (prompt, greedy(3))})["g"])
    runs = []
    for _ in range(2):
        engine = make_engine(
            model_dir, max_num_seqs=64, num_speculative_tokens=2,
            speculative_min_acceptance=0.0, speculative_max_batch=1000,
        )  # fmt: skip
        truths = {f"s{seed}": truth for seed in range(SEEDS)}
        engine.speculator.proposer = OracleProposer(truths, 1.0, engine.model_config.vocab_size)
        runs.append((_sampled(engine, prompt), engine.speculator.stats))
    return without, runs


def test_sampling_with_drafts_keeps_the_distribution(sampled):
    without, ((with_drafts, stats), _) = sampled
    assert 0 < stats.accepted["oracle"] < stats.proposed["oracle"]
    # A prefill whose last chunk is one token drafts too: the first token may be verified.
    picks = {
        "first": lambda t: t[0], "first two": lambda t: tuple(t[:2]),
        "last two": lambda t: tuple(t[1:]),
    }  # fmt: skip
    for name, pick in picks.items():
        stat, dof = _homogeneity([pick(t) for t in without.values()],
                                 [pick(t) for t in with_drafts.values()])  # fmt: skip
        assert dof >= 2 and stat < _critical(dof), (name, stat, dof)


def test_seeded_sampling_with_drafts_is_reproducible(sampled):
    _, ((first, _), (second, _)) = sampled
    assert first == second


# --- scheduling rules -------------------------------------------------------------------
def _greedy_run(model_dir, truth_p: float | None, params=None, count=3, **overrides):
    """(tokens, stats, steps' token counts) of `count` prompts with drafts (the oracle at
    `truth_p`, proposing the tokens of a run without drafts; None: n-gram)."""
    prompts = {f"r{i}": (list(range(10 + i, 30 + i)), params or greedy(NEW)) for i in range(count)}
    truth = {key: token_ids(outs) for key, outs in run_all(make_engine(model_dir), prompts).items()}
    args = dict(num_speculative_tokens=K, speculative_min_acceptance=0.0) | overrides
    engine = make_engine(model_dir, **args)
    if truth_p is not None:
        vocab = engine.model_config.vocab_size
        engine.speculator.proposer = OracleProposer(truth, truth_p, vocab)
    sizes = []
    schedule = engine.scheduler.schedule

    def recording():
        out = schedule()
        sizes.append(out.num_tokens)
        return out

    engine.scheduler.schedule = recording
    tokens = {key: token_ids(outs) for key, outs in run_all(engine, prompts).items()}
    assert tokens == truth
    return tokens, engine.stats(), sizes


def test_drafts_count_against_the_token_budget():
    _, stats, sizes = _greedy_run(tiny_checkpoint("llama"), 1.0, max_num_batched_tokens=6)
    assert max(sizes) <= 6
    # Three sequences of 1 + 3 tokens do not fit 6: drafts were cut, yet some verified.
    assert stats.spec_accepted["oracle"] > 0


def test_a_large_batch_decodes_without_drafts():
    model_dir = tiny_checkpoint("llama")
    _, stats, _ = _greedy_run(model_dir, 1.0, speculative_max_batch=3)
    assert stats.spec_proposed == {}
    _, stats, _ = _greedy_run(model_dir, 1.0, speculative_max_batch=4)
    assert stats.spec_proposed["oracle"] > 0


def test_low_acceptance_pauses_drafting():
    model_dir = tiny_checkpoint("llama")
    _, always, _ = _greedy_run(model_dir, 0.0)
    _, paused, _ = _greedy_run(model_dir, 0.0, speculative_min_acceptance=0.5)
    assert always.spec_accepted["oracle"] == paused.spec_accepted["oracle"] == 0
    # One miss takes each sequence's average from 0.5 to 0.25 < 0.5; its pause (16 steps)
    # then outlasts its run.
    assert paused.spec_verifications["oracle"] == 3 < always.spec_verifications["oracle"]


def test_requests_the_verifier_cannot_reproduce_do_not_draft():
    model_dir = tiny_checkpoint("llama")
    for extra in (dict(logprobs=2), dict(repetition_penalty=1.2), dict(logit_bias={5: 1.0}),
                  dict(min_tokens=NEW)):  # fmt: skip
        _, stats, _ = _greedy_run(model_dir, 1.0, params=greedy(NEW, **extra))
        assert stats.spec_proposed == {}, extra


def test_unsupported_settings_are_refused_by_name():
    model_dir = tiny_checkpoint("llama")
    with pytest.raises(ValueError, match=r"speculative_method must be one of \('ngram', 'mtp'\)"):
        EngineConfig(model_dir, num_speculative_tokens=2, speculative_method="eagle")
    with pytest.raises(ValueError, match="speculative_method 'mtp' needs a Qwen3.5"):
        make_engine(model_dir, num_speculative_tokens=2, speculative_method="mtp")
    with pytest.raises(ValueError, match="'mtp' is not supported with tensor_parallel_size 2"):
        EngineConfig(mtp_checkpoint("qwen3_5"), num_speculative_tokens=2,
                     speculative_method="mtp", tensor_parallel_size=2)  # fmt: skip
    with pytest.raises(ValueError, match="overlap_scheduling .* num_speculative_tokens 2"):
        EngineConfig(model_dir, num_speculative_tokens=2, overlap_scheduling=True)


# --- tensor parallelism -----------------------------------------------------------------
@pytest.mark.parametrize("family", ["qwen3_5"], indirect=True)
def test_tp2_with_drafts_equals_greedy_without(family):
    """Qwen3.5 (hybrid: its linear layers' states split over the ranks and rolled back
    after a rejection) under TP 2: drafts and acceptance decided on rank 0, the drafts
    sent in the step's input ids."""
    _, model_dir, prompts, first, _ = family
    oracle = lambda engine: OracleProposer(first, 0.6, engine.model_config.vocab_size)  # noqa: E731
    spec_first, spec_again, engine = _serve(
        model_dir, prompts, oracle, num_speculative_tokens=K, speculative_min_acceptance=0.0,
        tensor_parallel_size=2,
    )  # fmt: skip
    try:
        assert spec_first == first and spec_again == first
        stats = engine.speculator.stats
        assert 0 < stats.accepted["oracle"] < stats.proposed["oracle"]
    finally:
        engine.close()


def test_a_stop_inside_accepted_drafts_ends_the_request_there():
    model_dir = tiny_checkpoint("llama")
    prompt = list(range(10, 30))
    truth = token_ids(run_all(make_engine(model_dir), {"r": (prompt, greedy(NEW))})["r"])
    for params in (greedy(NEW, stop_token_ids=[truth[4]]), greedy(5), greedy(NEW, stop=["x"])):
        plain = token_ids(run_all(make_engine(model_dir), {"r": (prompt, params)})["r"])
        engine = make_engine(model_dir, num_speculative_tokens=K, speculative_min_acceptance=0.0)
        engine.speculator.proposer = OracleProposer({"r": truth}, 1.0, 384)
        assert token_ids(run_all(engine, {"r": (prompt, params)})["r"]) == plain
        assert engine.blocks.num_available == engine.blocks.num_pages
