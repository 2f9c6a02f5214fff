"""The KV store shared by the pods (llm_svc/engine/kv_store.py, store_link.py): a page one
engine computed is loaded by another engine (another pod: nothing shared but the store) and
its greedy tokens equal a cold prefill in float32, for Llama, Gemma 3 text (window pages),
Qwen3.5 (state snapshots) and Qwen3-VL with an image, through the in-process store and a
real redis-server. A request under another tenant salt cannot load them; a damaged value is
dropped and never served; a store that is down makes requests prefill, with the failure
counted; a full write queue drops writes, never blocks."""

from __future__ import annotations

import itertools
import threading

import pytest

from llm_svc import LLM
from llm_svc.engine import EngineConfig, LLMEngine
from llm_svc.engine.kv_store import KVStoreClient, KVStoreConfig, MemoryBackend, PendingWrite
from tests.fixtures.redis_server import free_port
from tests.llm_svc.checkpoints import tiny_checkpoint
from tests.llm_svc.conftest import greedy, run_all, token_ids
from tests.llm_svc.family_checkpoints import family_checkpoint
from tests.llm_svc.mm_reference import MMReference, make_image, same_tokens

PAGE_SIZE, NEW = 4, 6
CHECKPOINTS = {
    "llama": lambda: tiny_checkpoint("llama"),
    "gemma3_text": lambda: family_checkpoint("gemma3_text"),
    "qwen3_5": lambda: tiny_checkpoint("qwen3_5"),
}
_names = itertools.count()


def _memory_store() -> KVStoreConfig:
    return KVStoreConfig("memory", url=f"test-{next(_names)}")


def _engine(model_dir, store: KVStoreConfig | None, **overrides) -> LLMEngine:
    args = dict(page_size=PAGE_SIZE, num_pages=32, max_num_seqs=2, max_model_len=48,
                dtype="float32", device="cpu", state_snapshot_interval=2,
                max_num_batched_tokens=16, host_kv_bytes=4 << 20, kv_store=store)  # fmt: skip
    return LLMEngine(EngineConfig(model_dir, **(args | overrides)))


def _prompts(engine: LLMEngine) -> tuple[list[int], list[int]]:
    vocab = min(engine.model_config.vocab_size, 300)
    first = [(7 * i + 3) % vocab for i in range(26)]
    return first, first + [(13 * i + 2) % vocab for i in range(6)]


def _answer(engine: LLMEngine, prompt: list[int], salt: bytes = b"") -> tuple[list[int], int]:
    engine.add_request("r", prompt, greedy(NEW), cache_salt=salt)
    outs = []
    while engine.has_unfinished():
        outs += engine.step()
    return token_ids(outs), outs[-1].num_cached_tokens


def _cold(model_dir, prompt: list[int]) -> list[int]:
    engine = _engine(model_dir, None, enable_prefix_caching=False, host_kv_bytes=0)
    try:
        return token_ids(run_all(engine, {"cold": (prompt, greedy(NEW))})["cold"])
    finally:
        engine.close()


def _moved(model_dir, store: KVStoreConfig, salt: bytes = b"", other_salt: bytes | None = None):
    """The first turn on one engine, the next on another; (tokens, cached, its store stats,
    the next turn's prompt)."""
    writer = _engine(model_dir, store)
    first, second = _prompts(writer)
    try:
        _answer(writer, first, salt)
        assert writer.kv_store.flush(), "the writes did not finish"
        assert writer.kv_store.stats.bytes_written > 0
    finally:
        writer.close()
    reader = _engine(model_dir, store)
    try:
        tokens, cached = _answer(reader, second, salt if other_salt is None else other_salt)
        return tokens, cached, reader.kv_store.stats, second
    finally:
        reader.close()


@pytest.mark.parametrize("family", sorted(CHECKPOINTS))
def test_a_store_load_on_another_engine_equals_a_cold_prefill(family):
    model_dir = CHECKPOINTS[family]()
    tokens, cached, stats, second = _moved(model_dir, _memory_store())
    assert stats.hits > 0 and stats.checksum_failures == 0
    assert cached >= 4 * PAGE_SIZE  # the first turn's pages (a snapshot every 2 for qwen3_5)
    assert tokens == _cold(model_dir, second)


def test_through_a_real_redis(redis_server):
    model_dir = tiny_checkpoint("llama")
    store = KVStoreConfig("redis", url=redis_server)
    tokens, cached, stats, second = _moved(model_dir, store, salt=b"t" * 32)
    assert stats.hits == 6 and cached == 6 * PAGE_SIZE  # every full page of the first turn
    assert tokens == _cold(model_dir, second)


def test_another_tenant_salt_cannot_load_the_pages():
    model_dir = tiny_checkpoint("llama")
    store = _memory_store()
    tokens, cached, stats, second = _moved(model_dir, store, salt=b"a" * 32, other_salt=b"b" * 32)
    assert stats.hits == 0 and cached == 0
    assert tokens == _cold(model_dir, second)
    # The same salt on a third engine does load them: the salt was the only difference.
    engine = _engine(model_dir, store)
    try:
        _, cached = _answer(engine, second, b"a" * 32)
    finally:
        engine.close()
    assert cached > 0


def test_a_damaged_value_is_dropped_and_never_served():
    model_dir = tiny_checkpoint("llama")
    store = _memory_store()
    writer = _engine(model_dir, store)
    first, second = _prompts(writer)
    _answer(writer, first)
    assert writer.kv_store.flush()
    writer.close()
    data = MemoryBackend(store.url).data
    for key in list(data):  # one flipped byte in every value's payload
        raw = bytearray(data[key])
        raw[-1] ^= 0xFF
        data[key] = bytes(raw)
    reader = _engine(model_dir, store)
    try:
        tokens, cached = _answer(reader, second)
        assert reader.kv_store.stats.checksum_failures >= 1
        assert reader.kv_store.stats.hits == 0 and cached == 0
    finally:
        reader.close()
    assert tokens == _cold(model_dir, second)


def test_a_store_that_is_down_makes_requests_prefill():
    model_dir = tiny_checkpoint("llama")
    store = KVStoreConfig("redis", url=f"redis://127.0.0.1:{free_port()}/0", timeout_s=0.2)
    engine = _engine(model_dir, store)
    try:
        first, second = _prompts(engine)
        tokens, cached = _answer(engine, second)
        stats = engine.kv_store.stats
        assert stats.errors >= 1 and not stats.available and cached == 0
        _answer(engine, first)  # published while down: dropped, never blocking the step
        assert engine.kv_store.flush()
    finally:
        engine.close()
    assert tokens == _cold(model_dir, second)


def test_a_full_write_queue_drops_writes_and_never_blocks():
    release = threading.Event()

    class Stalled(MemoryBackend):
        def set_many(self, items):
            release.wait(10)
            super().set_many(items)

    client = KVStoreClient(KVStoreConfig("memory", url="stalled", write_queue=2),
                           backend=Stalled("stalled"))  # fmt: skip
    try:
        for index in range(10):
            client.write(PendingWrite(f"k{index}".encode(), lambda: b"x", lambda: True))
        assert client.stats.dropped_writes >= 7  # one in the writer's hands, two queued
        release.set()
        assert client.flush()
    finally:
        client.close()


def test_a_store_load_over_an_image_equals_hf(tiny_qwen3_vl_dir):
    reference = MMReference(tiny_qwen3_vl_dir)
    image = make_image(0)
    first = reference.prompt(["Describe", "please"], [image])
    second = reference.prompt(["Describe", "please, and say more about its colours"], [image])
    store = _memory_store()
    args = dict(page_size=PAGE_SIZE, num_pages=64, max_num_seqs=1,
                max_num_batched_tokens=512, host_kv_bytes=16 << 20, kv_store=store)  # fmt: skip
    params = greedy(NEW)
    writer = LLM(reference.model_dir, **args)
    writer.generate(prompt_token_ids=[first.ids], images=[first.images], sampling_params=params,
                    use_tqdm=False)  # fmt: skip
    assert writer.engine.kv_store.flush()
    writer.engine.close()
    reader = LLM(reference.model_dir, **args)
    out = reader.generate(prompt_token_ids=[second.ids], images=[second.images],
                          sampling_params=params, use_tqdm=False)[0]  # fmt: skip
    assert reader.engine.kv_store.stats.hits > 0
    assert out.num_cached_tokens > max(end for _, end in second.items[0].offsets)
    assert same_tokens(out.token_ids, reference.greedy(second, NEW))
    reader.engine.close()
