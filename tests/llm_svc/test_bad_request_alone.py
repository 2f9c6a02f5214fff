"""One bad request fails alone (issue 19, item 6): a batch with one poisoned request, run on
the engine directly with the tiny Qwen2-VL checkpoint and embeddings from a real `iris
cache` service on loopback. The poisoned request ends with its own RequestDataError; every
other request in its batch produces the same tokens as in a clean run of the same batch,
its pages are all given back, and nothing it computed is served to a later request.

The poisons: an embedding with NaN values in the cache (caught at fetch, before
acceptance), and an embedding that loses rows after the request was accepted, part-way
through its chunked prefill (found by the step that would use it). The second one is
written straight into the engine's held embeddings between steps: there is no wire path
that delivers a short embedding past the fetch check, which is the point of the check in
the step.
"""

from __future__ import annotations

import pytest
import torch

from embedding_cache_svc.client import CacheClient
from llm_svc.engine import EngineConfig, LLMEngine, RequestDataError
from llm_svc.engine.sequence import SequenceStatus
from tests.llm_svc.conftest import greedy
from tests.llm_svc.mm_reference import make_image

MAX_NEW = 6
POISONED = "poisoned"


@pytest.fixture(scope="module")
def batch(qwen_reference):
    """The poisoned request first (so it is admitted in the first step), then two image
    requests and two text requests."""
    prompts = {POISONED: qwen_reference.prompt(["Poisoned", "image"], [make_image(60)])}
    prompts |= {
        f"image{i}": qwen_reference.prompt(["Describe", "this"], [make_image(61 + i)])
        for i in range(2)
    }
    prompts |= {f"text{i}": qwen_reference.prompt([f"Only text number {i}"], []) for i in range(2)}
    return prompts


def _engine(qwen_reference, address: str, budget: int) -> LLMEngine:
    config = EngineConfig(
        qwen_reference.model_dir, page_size=4, max_num_batched_tokens=budget, num_pages=256,
        max_num_seqs=8, cache_address=address, embedding_wait_s=5.0, cache_timeout_s=2.0,
        device="cpu", dtype="float32",
    )  # fmt: skip
    return LLMEngine(config)


@pytest.fixture(scope="module")
def embeddings(qwen_reference, batch) -> dict:
    """Each image request's embedding, as an encoder would store it (encoded once)."""
    return {rid: qwen_reference.embeddings(p.images)[0] for rid, p in batch.items() if p.images}


def _store(client: CacheClient, embeddings, prompts, poison_nan: bool = False) -> None:
    for request_id, prompt in prompts.items():
        for item in prompt.items:
            embedding = embeddings[request_id]
            client.delete([item.key])
            if poison_nan and request_id == POISONED:
                embedding = embedding.clone()
                embedding[3, :5] = float("nan")
            client.put(item.key, embedding, item.token_count)


def _run(engine: LLMEngine, prompts, on_step=None) -> dict:
    """Add every request (in order), step until done: request_id → (tokens, last output)."""
    for request_id, prompt in prompts.items():
        engine.add_request(request_id, prompt.padded, greedy(MAX_NEW), items=prompt.items)
    tokens = {request_id: [] for request_id in prompts}
    last = {}
    while engine.has_unfinished():
        for out in engine.step():
            tokens[out.request_id].extend(out.new_token_ids)
            last[out.request_id] = out
        if on_step is not None:
            on_step(engine)
    return {request_id: (tokens[request_id], last[request_id]) for request_id in prompts}


def _budget(batch) -> int:
    """A step budget whose first chunk of the poisoned prompt ends inside its image."""
    return batch[POISONED].items[0].offsets[0][0] + 4


@pytest.fixture(scope="module")
def clean(qwen_reference, memory_cache_service, batch, embeddings) -> dict:
    """Every request's tokens in a clean run of the same batch on a fresh engine."""
    client = CacheClient(memory_cache_service.address, qwen_reference.fingerprint)
    _store(client, embeddings, batch)
    engine = _engine(qwen_reference, memory_cache_service.address, _budget(batch))
    results = _run(engine, batch)
    engine.close()
    client.close()
    assert all(last.finish_reason == "length" for _, last in results.values())
    return {request_id: tokens for request_id, (tokens, _) in results.items()}


def _check_the_others(results: dict, clean: dict, engine: LLMEngine) -> None:
    for request_id, (tokens, last) in results.items():
        if request_id != POISONED:
            assert last.finish_reason == "length" and last.error is None, request_id
            assert tokens == clean[request_id], request_id
    assert not engine.requests and engine.blocks.num_used == 0


def _rerun_is_clean(
    engine: LLMEngine, qwen_reference, memory_cache_service, batch, embeddings, clean
) -> None:
    """With good data, the poisoned prompt on the same engine (its prefix cache warm with
    whatever the failed run left) gives the clean tokens: nothing bad was cached."""
    client = CacheClient(memory_cache_service.address, qwen_reference.fingerprint)
    _store(client, embeddings, {POISONED: batch[POISONED]})
    again = _run(engine, {POISONED: batch[POISONED]})
    tokens, last = again[POISONED]
    assert last.finish_reason == "length" and tokens == clean[POISONED]
    client.close()


def test_an_embedding_with_nan_values_fails_its_request_alone(
    qwen_reference, memory_cache_service, batch, embeddings, clean
):
    client = CacheClient(memory_cache_service.address, qwen_reference.fingerprint)
    _store(client, embeddings, batch, poison_nan=True)
    engine = _engine(qwen_reference, memory_cache_service.address, _budget(batch))
    results = _run(engine, batch)
    tokens, last = results[POISONED]
    assert last.finish_reason == "error" and tokens == []
    assert isinstance(last.error, RequestDataError)
    assert "items[0]" in str(last.error) and "NaN or infinite" in str(last.error)
    # The pod reported the entry (Delete is admin-only); the cache checked it and dropped it.
    assert client.exists([batch[POISONED].items[0].key]) == [False]
    _check_the_others(results, clean, engine)
    _rerun_is_clean(engine, qwen_reference, memory_cache_service, batch, embeddings, clean)
    engine.close()
    client.close()


def test_an_embedding_short_of_rows_mid_prefill_fails_its_request_alone(
    qwen_reference, memory_cache_service, batch, embeddings, clean
):
    client = CacheClient(memory_cache_service.address, qwen_reference.fingerprint)
    _store(client, embeddings, batch)
    client.close()
    engine = _engine(qwen_reference, memory_cache_service.address, _budget(batch))
    poisoned = {}

    def truncate_once_part_way(engine: LLMEngine) -> None:
        seq = engine.requests.get(POISONED)
        if seq is None or poisoned or seq.status is not SequenceStatus.RUNNING:
            return
        image_end = seq.items[0].offsets[-1][1]
        assert seq.accepted and 0 < seq.num_computed_tokens <= image_end
        poisoned["at"] = seq.num_computed_tokens
        seq.embeddings[0] = seq.embeddings[0][:2]  # the rows the next chunk needs are gone

    results = _run(engine, batch, truncate_once_part_way)
    assert poisoned, "the poisoned request never ran part-way through its image"
    tokens, last = results[POISONED]
    assert last.finish_reason == "error" and tokens == []
    assert isinstance(last.error, RequestDataError) and "embedding has 2 rows" in str(last.error)
    _check_the_others(results, clean, engine)
    _rerun_is_clean(engine, qwen_reference, memory_cache_service, batch, embeddings, clean)
    engine.close()


def test_nan_from_any_source_never_reaches_the_batch(qwen_reference, batch, embeddings):
    """The fetch check itself, on a tensor with one inf: the error names the item."""
    from llm_svc.engine.embeddings import EmbeddingFetcher
    from llm_svc.engine.embeddings.base import EmbeddingSource

    item = batch["image0"].items[0]
    good = embeddings["image0"]
    hidden = good.shape[1]

    class Fixed(EmbeddingSource):
        released: list = []

        def fetch(self, items, hidden, dtype):
            bad = good.clone()
            bad[0, 0] = float("inf")
            return {index: bad for index in items}

        def release(self, items):
            self.released.extend(items)

    source = Fixed()
    fetcher = EmbeddingFetcher(source, hidden, torch.float32, torch.device("cpu"), workers=1)
    with pytest.raises(RequestDataError, match=r"items\[0\] .* 1 NaN or infinite"):
        fetcher._fetch({0: item})
    assert source.released == [item]  # what the fetch held is given back
    fetcher.close()
