"""The serving path: embeddings from a real `iris cache` service on loopback — parity with
HF, waiting on an entry still being encoded, eviction while a request uses the entry, and
each failure (failed entry, missing, pending past the deadline, unreachable cache) ending
its own request only."""

from __future__ import annotations

import socket
import threading
import time

import pytest

from embedding_cache_svc.client import CacheClient, Status
from llm_svc.engine import CacheEmbeddingSource, EngineConfig, LLMEngine
from llm_svc.engine.errors import CacheUnavailableError, EmbeddingMissingError, ImageFailedError
from llm_svc.engine.sequence import SequenceStatus
from tests.llm_svc.conftest import greedy
from tests.llm_svc.mm_reference import (
    FAMILIES,
    GatedSource,
    MMReference,
    admit_together,
    make_image,
    same_tokens,
)

MAX_NEW = 6


def _engine(reference, address: str, source=None, **overrides) -> LLMEngine:
    args = dict(page_size=4, max_num_batched_tokens=512, num_pages=256, max_num_seqs=8)
    args |= dict(cache_address=address, embedding_wait_s=5.0, cache_timeout_s=2.0)
    args |= dict(device="cpu", dtype="float32")
    config = EngineConfig(reference.model_dir, **(args | overrides))
    return LLMEngine(config, embedding_source=source)


def _client(service, reference) -> CacheClient:
    return CacheClient(service.address, reference.fingerprint)


def _put(client: CacheClient, reference, prompt) -> None:
    """Store the prompt's image embeddings, as the encoder service would."""
    for item, embedding in zip(prompt.items, reference.embeddings(prompt.images), strict=True):
        client.put(item.key, embedding, item.token_count)


def _run(engine: LLMEngine, requests: dict, on_step=None, gate=None) -> dict:
    """Add (padded ids, items) requests, step until done: request_id → (ids, last output).
    With `gate` (a GatedSource), every request is admitted in the same step."""
    for request_id, prompt in requests.items():
        engine.add_request(request_id, prompt.padded, greedy(MAX_NEW), items=prompt.items)
    if gate is not None:
        admit_together(engine, gate)
    tokens = {request_id: [] for request_id in requests}
    last = {}
    steps = 0
    while engine.has_unfinished():
        for out in engine.step():
            tokens[out.request_id].extend(out.new_token_ids)
            last[out.request_id] = out
        steps += 1
        if on_step is not None:
            on_step(engine, steps)
    return {request_id: (tokens[request_id], last[request_id]) for request_id in requests}


@pytest.mark.parametrize("family", list(FAMILIES))
def test_cache_backed_greedy_equals_hf_and_survives_eviction_and_preemption(
    family, memory_cache_service, request
):
    reference = MMReference(request.getfixturevalue(FAMILIES[family]))
    prompts = [reference.prompt(["Describe", "please"], [make_image(20 + i)]) for i in range(3)]
    client = _client(memory_cache_service, reference)
    for prompt in prompts:
        _put(client, reference, prompt)
    longest = max(len(p.padded) for p in prompts) + MAX_NEW
    source = CacheEmbeddingSource.connect(
        memory_cache_service.address, reference.fingerprint, wait_s=5.0, timeout_s=2.0
    )
    gate = GatedSource(source)
    pages = -(-longest // 4) + 4
    engine = _engine(reference, None, gate, num_pages=pages, max_num_batched_tokens=20)
    evicted = []

    def evict_once_accepted(engine, _):
        # The cache drops every entry as soon as its request is accepted: assembly and the
        # re-prefill after preemption use the embedding the request holds.
        for seq in list(engine.requests.values()):
            if seq.accepted and seq.request_id not in evicted:
                evicted.append(seq.request_id)
                assert client.delete([item.key for item in seq.items]) == 1

    requests = {f"r{i}": p for i, p in enumerate(prompts)}
    results = _run(engine, requests, evict_once_accepted, gate)
    assert engine.stats().preemptions > 0 and len(evicted) == 3
    for index, prompt in enumerate(prompts):
        tokens, last = results[f"r{index}"]
        assert last.finish_reason == "length" and last.error is None
        assert same_tokens(tokens, reference.greedy(prompt, MAX_NEW))
    assert engine.fetcher.num_fetched == 3  # once each, preemption or not
    assert client.exists([item.key for p in prompts for item in p.items]) == [False] * 3
    engine.close()
    client.close()


def test_a_repeated_image_with_a_warm_prefix_fetches_nothing(qwen_reference, memory_cache_service):
    prompt = qwen_reference.prompt(["Describe", "please"], [make_image(30)])
    client = _client(memory_cache_service, qwen_reference)
    _put(client, qwen_reference, prompt)
    engine = _engine(qwen_reference, memory_cache_service.address)
    first, _ = _run(engine, {"a": prompt})["a"]
    assert engine.fetcher.num_fetched == 1
    client.delete([prompt.items[0].key])  # not even the cache has it now
    again, last = _run(engine, {"b": prompt})["b"]
    assert again == first and same_tokens(again, qwen_reference.greedy(prompt, MAX_NEW))
    assert last.num_cached_tokens > prompt.items[0].offsets[-1][1]
    assert engine.fetcher.num_fetched == 1
    engine.close()
    client.close()


def test_an_entry_being_encoded_is_waited_for(qwen_reference, memory_cache_service):
    prompt = qwen_reference.prompt(["Describe", "please"], [make_image(31)])
    item = prompt.items[0]
    client = _client(memory_cache_service, qwen_reference)
    assert client.reserve([(item.key, item.token_count)], lease_ms=10_000) == [Status.RESERVED]
    engine = _engine(qwen_reference, memory_cache_service.address, embedding_wait_s=60.0)
    text = qwen_reference.prompt(["Only text here"], [])
    engine.add_request("image", prompt.padded, greedy(MAX_NEW), items=prompt.items)
    engine.add_request("text", text.padded, greedy(MAX_NEW))
    seq = engine.requests["image"]
    text_tokens = []
    for _ in range(MAX_NEW + 2):  # the text request runs to its end meanwhile
        text_tokens += [t for out in engine.step() if out.request_id == "text"
                        for t in out.new_token_ids]  # fmt: skip
    assert seq.status is SequenceStatus.FETCHING and not seq.accepted
    assert len(text_tokens) == MAX_NEW and "text" not in engine.requests
    assert engine.stats().waiting == 1
    embedding = qwen_reference.embeddings(prompt.images)[0]
    threading.Timer(0.2, client.put, (item.key, embedding, item.token_count)).start()
    tokens, last = _finish(engine, "image")
    assert seq.accepted and last.error is None
    assert same_tokens(tokens, qwen_reference.greedy(prompt, MAX_NEW))
    engine.close()
    client.close()


def _finish(engine: LLMEngine, request_id: str):
    tokens, last = [], None
    while engine.has_unfinished():
        for out in engine.step():
            if out.request_id == request_id:
                tokens.extend(out.new_token_ids)
                last = out
    return tokens, last


def _failure(engine: LLMEngine, prompt, request_id: str):
    """Run `prompt` beside a text request; the text one must finish normally."""
    engine.add_request(request_id, prompt.padded, greedy(MAX_NEW), items=prompt.items)
    engine.add_request("bystander", list(range(20, 40)), greedy(MAX_NEW))
    outputs = {}
    started = time.monotonic()
    while engine.has_unfinished():
        for out in engine.step():
            outputs.setdefault(out.request_id, []).append(out)
    assert outputs["bystander"][-1].finish_reason == "length"
    last = outputs[request_id][-1]
    assert last.finished and last.finish_reason == "error" and not last.new_token_ids
    assert not engine.requests and engine.blocks.num_used == 0
    return last.error, time.monotonic() - started


def test_a_failed_entry_fails_its_request_with_the_reason(qwen_reference, memory_cache_service):
    prompt = qwen_reference.prompt(["Broken", "image"], [make_image(32)])
    item = prompt.items[0]
    client = _client(memory_cache_service, qwen_reference)
    client.reserve([(item.key, item.token_count)], lease_ms=10_000)
    client.fail(item.key, "image bytes are not a PNG, JPEG or WebP", item.token_count)
    engine = _engine(qwen_reference, memory_cache_service.address)
    error, _ = _failure(engine, prompt, "bad")
    assert isinstance(error, ImageFailedError)
    assert str(error) == "image bytes are not a PNG, JPEG or WebP"
    engine.close()


def test_an_image_nobody_encodes_is_embedding_missing_at_once(qwen_reference, memory_cache_service):
    prompt = qwen_reference.prompt(["Nobody", "encodes this"], [make_image(33)])
    engine = _engine(qwen_reference, memory_cache_service.address, embedding_wait_s=30.0)
    error, elapsed = _failure(engine, prompt, "missing")
    assert isinstance(error, EmbeddingMissingError) and "embedding missing" in str(error)
    assert "nobody is encoding it" in str(error)
    assert elapsed < 30.0  # FREE is known at once: no wait for the deadline
    engine.close()


def test_an_entry_still_pending_at_the_deadline_is_embedding_missing(
    qwen_reference, memory_cache_service
):
    prompt = qwen_reference.prompt(["Slow", "encoder"], [make_image(34)])
    item = prompt.items[0]
    client = _client(memory_cache_service, qwen_reference)
    client.reserve([(item.key, item.token_count)], lease_ms=20_000)
    engine = _engine(qwen_reference, memory_cache_service.address, embedding_wait_s=0.3)
    error, _ = _failure(engine, prompt, "slow")
    assert isinstance(error, EmbeddingMissingError)
    assert "still pending after 0.3 s" in str(error)
    engine.close()
    client.close()


def test_an_unreachable_cache_is_cache_unavailable(qwen_reference):
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        dead = f"127.0.0.1:{probe.getsockname()[1]}"
    prompt = qwen_reference.prompt(["No", "cache"], [make_image(35)])
    engine = _engine(qwen_reference, dead, cache_timeout_s=1.0)
    error, _ = _failure(engine, prompt, "nocache")
    assert isinstance(error, CacheUnavailableError)
    engine.close()


def test_abort_while_fetching_releases_everything(qwen_reference, memory_cache_service):
    prompt = qwen_reference.prompt(["Abort", "me"], [make_image(36)])
    item = prompt.items[0]
    client = _client(memory_cache_service, qwen_reference)
    client.reserve([(item.key, item.token_count)], lease_ms=20_000)
    engine = _engine(qwen_reference, memory_cache_service.address, embedding_wait_s=0.5)
    engine.add_request("gone", prompt.padded, greedy(MAX_NEW), items=prompt.items)
    engine.step()
    assert engine.requests["gone"].status is SequenceStatus.FETCHING
    assert engine.abort("gone")
    outputs = _finish_all(engine)
    assert [o.finish_reason for o in outputs] == ["abort"]
    assert engine.scheduler.num_fetching == 0 and engine.blocks.num_used == 0
    engine.close()
    client.close()


def _finish_all(engine: LLMEngine) -> list:
    outputs = []
    while engine.has_unfinished():
        outputs += engine.step()
    return outputs
