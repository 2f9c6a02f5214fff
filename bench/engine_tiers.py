"""`bench/engine.py --only tiers`: one pod's host KV tier on an image chat with think time.

`--tier-conversations` conversations (16) of `--tier-turns` turns (4) on the demo model: each
opens with one image (its embedding put in a real cache service on loopback beforehand, so
both engines fetch it and neither runs the vision tower while timed) and every turn adds
48 tokens of question, then the 8-token answer is part of the next turn's prompt. The
conversations take turns: every other conversation has its turn between two of one's (its
user is thinking). The device pool is sized for a quarter of the live conversations at
their longest, so under device-only caching their pages are evicted between turns.

Two engines in one process, same pool, same requests in the same order, each request run
on one then the other (alternating which goes first): host tier off, and on with
`--tier-host-factor` (8) times the device pool's bytes. Printed: later-turn (turn 2 on) TTFT
p50 and p90 of each and their ratio (target: p90 >= 3x better with the tier), prefill
tokens computed, host hits, bytes copied back per host hit and what that would take over
PCIe 5.0 x16 (63 GB/s each way, nominal: here the copy is within RAM; on a GPU it crosses
the bus).
"""

from __future__ import annotations

import random
import statistics
import time
from pathlib import Path

from llm_svc.engine import EngineConfig, LLMEngine, SamplingParams

QUESTION, ANSWER = 48, 8
PCIE5_X16 = 63e9  # bytes/s each way, nominal


def _turn(engine: LLMEngine, request_id: str, ids, items) -> tuple[float, list[int], int]:
    """TTFT, the answer's tokens and the prompt tokens it had cached."""
    params = SamplingParams(temperature=0.0, max_tokens=ANSWER, ignore_eos=True)
    start = time.perf_counter()
    engine.add_request(request_id, ids, params, items=items)
    first, tokens, cached = None, [], 0
    while engine.has_unfinished():
        for out in engine.step():
            if out.new_token_ids and first is None:
                first = time.perf_counter() - start
            tokens += out.new_token_ids
            cached = out.num_cached_tokens or cached
    return first, tokens, cached


def bench_tiers(directory: Path, args) -> None:
    from bench.engine import CacheService, image_request
    from embedding_cache_svc.client import CacheClient
    from iris.models import load_adapter

    conversations, turns = args.tier_conversations, args.tier_turns
    service = CacheService()
    adapter = load_adapter(directory)
    probe = LLMEngine(EngineConfig(directory, num_pages=16, device=args.device))
    page, fingerprint, device = probe.config.page_size, probe.fingerprint, probe.config.device
    dtype = probe.config.torch_dtype
    vocab, page_bytes = probe.model_config.vocab_size, probe.runner.kv_bytes_per_page()
    probe.close()
    runner = adapter.vision_runner(device=device, dtype=dtype)
    client = CacheClient(service.address, fingerprint)
    chats = []
    for index in range(conversations):
        ids, items, image = image_request(adapter, fingerprint, 500 + index, 16, vocab)
        item = items[0]
        client.reserve([(item.key, item.token_count)], lease_ms=60_000)
        client.put(item.key, runner.encode([runner.preprocess(image)])[0], item.token_count)
        chats.append((list(ids), items))
    longest = len(chats[0][0]) + turns * (QUESTION + ANSWER)
    pages = max(1, conversations // 4) * -(-longest // page)
    common = dict(num_pages=pages, max_num_seqs=4, max_num_batched_tokens=512,
                  max_model_len=longest + 64, device=device,
                  cache_address=service.address, embedding_wait_s=60.0)  # fmt: skip
    host_bytes = int(args.tier_host_factor * pages * page_bytes)
    engines = {
        "device only": LLMEngine(EngineConfig(directory, **common)),
        "host tier": LLMEngine(EngineConfig(directory, host_kv_bytes=host_bytes, **common)),
    }
    print(f"{conversations} conversations x {turns} turns, first prompt {len(chats[0][0])} "
          f"tokens (one image, {chats[0][1][0].token_count} image tokens), +{QUESTION} question "
          f"+{ANSWER} answer a turn; device pool {pages} pages of {page} tokens "
          f"({pages * page_bytes / 2**20:.0f} MiB, a quarter of the live conversations); host "
          f"tier {host_bytes / 2**20:.0f} MiB")  # fmt: skip
    words = random.Random(3)
    ttfts = {name: [] for name in engines}
    computed = dict.fromkeys(engines, 0)
    prompts = [ids for ids, _ in chats]
    for turn in range(turns):
        for index, (_, items) in enumerate(chats):
            if turn:
                prompts[index] += [words.randrange(100, vocab - 100) for _ in range(QUESTION)]
            answers = {}
            order = list(engines) if (turn + index) % 2 else list(engines)[::-1]
            for name in order:
                elapsed, tokens, cached = _turn(engines[name], f"{index}-{turn}-{name}",
                                                prompts[index], items)  # fmt: skip
                answers[name] = tokens
                computed[name] += len(prompts[index]) - cached
                if turn:
                    ttfts[name].append(elapsed)
            assert answers["device only"] == answers["host tier"], (index, turn)
            prompts[index] += answers["host tier"]
    stats = engines["host tier"].runner.host_tier.stats
    hits = stats.page_lookups["host"]
    loads = len(stats.load_seconds)
    p = {name: _quantiles(values) for name, values in ttfts.items()}
    for name in engines:
        print(f"{name:12s} later-turn TTFT p50 {p[name][0] * 1e3:7.1f} ms, p90 "
              f"{p[name][1] * 1e3:7.1f} ms; prefill tokens computed {computed[name]}")  # fmt: skip
    per_hit = stats.bytes_to_device / max(1, loads)
    print(f"host tier: {hits} pages from host memory in {loads} requests, {per_hit / 2**20:.2f} "
          f"MiB copied back a request ({per_hit / PCIE5_X16 * 1e3:.3f} ms over PCIe 5.0 x16 at "
          f"63 GB/s; here within RAM, mean {statistics.fmean(stats.load_seconds or [0]) * 1e3:.2f}"
          f" ms); {stats.bytes_to_host / 2**20:.1f} MiB saved to it")  # fmt: skip
    print(f"ratio R {p['device only'][0] / p['host tier'][0]:.2f}  later-turn TTFT p50, device "
          f"only / host tier")  # fmt: skip
    print(f"ratio R {p['device only'][1] / p['host tier'][1]:.2f}  later-turn TTFT p90, device "
          f"only / host tier (target >= 3)")  # fmt: skip
    print(f"ratio R {computed['device only'] / max(1, computed['host tier']):.2f}  prefill tokens "
          f"computed, device only / host tier")  # fmt: skip
    for engine in engines.values():
        engine.close()
    client.close()
    service.close()


def _quantiles(values: list[float]) -> tuple[float, float]:
    ordered = sorted(values)
    return statistics.median(ordered), ordered[min(len(ordered) - 1, int(0.9 * len(ordered)))]
