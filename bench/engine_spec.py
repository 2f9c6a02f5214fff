"""`bench/engine.py --only spec`: speculative decoding's decode throughput against plain
decode, side by side in one run, at batch 1 and 4 (greedy, EOS ignored).

- The oracle proposer (llm_svc/engine/spec/oracle.py, test and bench only) proposes the
  true continuation (the tokens of a run without drafts), each token right with
  probability p (p = 0, 0.5, 0.8, 1.0), k = `--spec-k`; at p = 0 with the low-acceptance
  switch-off disabled and enabled (IRIS_LLM_SPECULATIVE_MIN_ACCEPTANCE 0 and 0.3).
- n-gram (prompt lookup) on a prompt the model repeats (a sentence said over and over).

Decode tokens/s counts the tokens after each request's first, over the time from the step
that gave the last request its first token to the end (prefill excluded). Each figure is the
best of `--repeats` runs, the runs of all variants alternating. Every run's tokens are
checked equal to the plain run's. MTP (Qwen3.5's own layer, `speculative_method` "mtp") is
not benched here: the demo model is no Qwen3.5, and a random-weight MTP layer (make-tiny's)
cannot show what a trained one would accept (docs/design/engine.md)."""

from __future__ import annotations

import time
from pathlib import Path

from llm_svc.engine import EngineConfig, LLMEngine, SamplingParams
from llm_svc.engine.spec import NgramProposer, OracleProposer

REPEATED = "The quick brown fox jumps over the lazy dog. " * 6


def _decode(engine: LLMEngine, prompts: list[list[int]], out: int) -> tuple[float, dict]:
    """(decode tokens/s, tokens by request) of `prompts` run together."""
    params = SamplingParams(temperature=0.0, max_tokens=out, ignore_eos=True)
    for index, prompt in enumerate(prompts):
        engine.add_request(f"r{index}", prompt, params)
    tokens: dict[str, list[int]] = {f"r{i}": [] for i in range(len(prompts))}
    started = None
    while engine.has_unfinished():
        for output in engine.step():
            tokens[output.request_id] += output.new_token_ids
        if started is None and all(tokens.values()):
            started = time.perf_counter()
            first = sum(len(t) for t in tokens.values())
    elapsed = time.perf_counter() - started
    return (sum(len(t) for t in tokens.values()) - first) / elapsed, tokens


def bench_spec(directory: Path, args) -> None:
    k, out = args.spec_k, args.spec_out
    common = dict(max_num_batched_tokens=512, kv_cache_bytes=1 << 30, device=args.device)
    plain = LLMEngine(EngineConfig(directory, **common))
    spec = LLMEngine(
        EngineConfig(directory, num_speculative_tokens=k, speculative_min_acceptance=0.0, **common)
    )
    vocab = plain.model_config.vocab_size
    tokenizer = plain.tokenizer
    print(f"device {plain.config.device}, k = {k}, {out} tokens per request")
    texts = [
        "The history of the city begins",
        "A recipe for bread needs",
        "In mathematics, a prime number",
        "The weather tomorrow will",
    ]
    for batch in (1, 4):
        prompts = [tokenizer(text)["input_ids"] for text in texts[:batch]]
        repeated = [tokenizer(REPEATED + text)["input_ids"] for text in texts[:batch]]
        _decode(plain, prompts, 4)  # warm-up
        _, truth = _decode(plain, prompts, out)
        variants = {"plain": (plain, prompts, None, 0.0)}
        for p in (0.0, 0.5, 0.8, 1.0):
            oracle = lambda p=p, truth=truth: OracleProposer(truth, p, vocab)  # noqa: E731
            variants[f"oracle p={p}"] = (spec, prompts, oracle, 0.0)
        variants["oracle p=0.0, switch-off on"] = (
            spec, prompts, lambda truth=truth: OracleProposer(truth, 0.0, vocab), 0.3,
        )  # fmt: skip
        variants["plain, repeated prompt"] = (plain, repeated, None, 0.0)
        variants["ngram, repeated prompt"] = (spec, repeated, lambda: NgramProposer(vocab), 0.3)
        best: dict[str, float] = {}
        accepted: dict[str, str] = {}
        references: dict[int, dict] = {}
        for _ in range(args.repeats):
            for name, (engine, batch_prompts, proposer, floor) in variants.items():
                if proposer is not None:
                    engine.speculator.proposer = proposer()
                    engine.speculator.min_acceptance = floor
                    before = (
                        dict(engine.speculator.stats.accepted),
                        dict(engine.speculator.stats.proposed),
                    )
                rate, tokens = _decode(engine, batch_prompts, out)
                reference = references.setdefault(id(batch_prompts), tokens)
                assert tokens == reference, f"{name}: tokens differ from the plain run's"
                best[name] = max(best.get(name, 0.0), rate)
                if proposer is not None:
                    stats, method = engine.speculator.stats, engine.speculator.proposer.name
                    took = stats.accepted[method] - before[0].get(method, 0)
                    offered = stats.proposed[method] - before[1].get(method, 0)
                    accepted[name] = f"accepted {took}/{offered}"
        print(f"\nbatch {batch}: decode tokens/s (best of {args.repeats})")
        for name, rate in best.items():
            base = best["plain, repeated prompt" if "repeated" in name else "plain"]
            print(f"  {name:34s} {rate:8.1f}   ratio {rate / base:5.2f}  {accepted.get(name, '')}")
