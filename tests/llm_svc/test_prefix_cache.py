"""Radix prefix cache: page sharing, LRU eviction, and KV events that mirror the cache."""

from __future__ import annotations

from iris.multimodal import block_hashes
from llm_svc.engine import BlockRemoved, BlockStored, replay
from llm_svc.engine.radix_cache import RadixCache
from tests.llm_svc.conftest import greedy, make_engine, run_all, token_ids

FINGERPRINT = bytes(range(32))


def test_match_insert_and_lru_eviction_order():
    cache = RadixCache(page_size=2, fingerprint=FINGERPRINT)
    a, _ = cache.insert(None, [1, 2], page=0)
    b, _ = cache.insert(a, [3, 4], page=1)
    c, _ = cache.insert(a, [5, 6], page=2)
    assert cache.match([1, 2, 3, 4, 9]) == [a, b]
    assert cache.match([1, 2, 5]) == [a]  # a partial page never matches
    again, created = cache.insert(a, [3, 4], page=7)
    assert again is b and not created
    cache.release([a, b])
    cache.release([c])
    cache.acquire([a, c])  # c used most recently; b is the LRU leaf
    cache.release([a, c])
    assert cache.num_unreferenced == 3
    assert cache.evict(1) == [1]
    # a is not a leaf until c goes: c first, then a.
    assert cache.evict(5) == [2, 0]
    assert cache.num_nodes == 0 and cache.num_unreferenced == 0


def test_referenced_pages_are_never_evicted():
    cache = RadixCache(page_size=2, fingerprint=FINGERPRINT)
    a, _ = cache.insert(None, [1, 2], page=0)
    b, _ = cache.insert(a, [3, 4], page=1)
    cache.release([b])
    assert cache.evict(2) == [1]
    assert cache.match([1, 2, 3, 4]) == [a]


def test_block_hashes_chain_from_the_fingerprint():
    cache = RadixCache(page_size=2, fingerprint=FINGERPRINT)
    a, _ = cache.insert(None, [1, 2], page=0)
    b, _ = cache.insert(a, [3, 1_000_001], page=1)
    assert [a.block_hash, b.block_hash] == block_hashes(FINGERPRINT, [1, 2, 3, 1_000_001, 5], 2)
    stored = cache.take_events()
    assert [type(e) for e in stored] == [BlockStored, BlockStored]
    assert stored[1].parent_hash == a.block_hash and stored[1].token_ids == (3, 1_000_001)


def test_second_request_sharing_a_prefix_reuses_pages(llama_dir):
    engine = make_engine(llama_dir, page_size=4, num_pages=64)
    shared = list(range(10, 30))  # 20 tokens = 5 full pages
    run_all(engine, {"a": (shared + [40, 41, 42], greedy(3))})
    free_before = len(engine.blocks.free_pages)
    seq = engine.add_request("b", shared + [50, 51], greedy(2))
    out = engine.step()
    # b's 22 tokens need 6 pages; 5 come from the cache, one partial page is new.
    assert free_before - len(engine.blocks.free_pages) == 1
    assert seq.block_table[:5] == [node.page for node in engine.blocks.cache.match(shared)]
    assert out[0].num_cached_tokens == 20
    assert engine.stats().prefix_hit_tokens == 20


def test_events_replayed_equal_the_cached_pages_through_eviction(llama_dir):
    engine = make_engine(llama_dir, page_size=4, num_pages=12, max_num_batched_tokens=16)
    index: set[bytes] = set()
    prompts = {f"r{i}": ([7 + i] * 9 + list(range(20, 30)), greedy(6)) for i in range(6)}
    for request_id, request in prompts.items():
        run_all(engine, {request_id: request})
        events = engine.take_kv_events()
        replay(events, into=index)
        assert index == engine.blocks.cache.block_hashes()
    assert any(isinstance(e, BlockRemoved) for e in events), "the small cache must evict"
    # The index also equals the hashes a router computes from a cached prompt.
    last_ids = prompts["r5"][0]
    assert set(block_hashes(engine.fingerprint, last_ids, 4)) <= index


def test_identical_requests_in_one_batch_share_pages_after_commit(llama_dir):
    engine = make_engine(llama_dir, page_size=4, num_pages=64)
    ids = list(range(30, 47))  # 17 tokens: 4 full pages
    outputs = run_all(engine, {"x": (ids, greedy(4)), "y": (ids, greedy(4))})
    assert token_ids(outputs["x"]) == token_ids(outputs["y"])
    # Both computed the same 4 full pages at once; the cache keeps one copy of each (plus
    # the page completed during decode, also identical for both).
    assert engine.blocks.cache.num_nodes == 5
    assert engine.blocks.num_used == 0


SALT_A, SALT_B = bytes(range(32)), bytes(range(1, 33))


def test_each_salt_has_its_own_namespace():
    cache = RadixCache(page_size=2, fingerprint=FINGERPRINT)
    shared, _ = cache.insert(None, [1, 2], page=0)
    tenant, created = cache.insert(None, [1, 2], page=1, salt=SALT_A)
    assert created and tenant is not shared  # same tokens, another tenant: another page
    assert cache.match([1, 2, 3]) == [shared]
    assert cache.match([1, 2, 3], SALT_A) == [tenant]
    assert cache.match([1, 2, 3], SALT_B) == []
    # The salted page's hash chains on the salted root: events and index are per salt.
    assert tenant.block_hash == block_hashes(FINGERPRINT, [1, 2], 2, SALT_A)[0]
    assert tenant.block_hash != shared.block_hash
    # A salted namespace that loses its last page is dropped; the shared one stays.
    cache.release([shared, tenant])
    assert sorted(cache.evict(2)) == [0, 1]
    assert set(cache.roots) == {b""} and cache.num_nodes == 0


def test_requests_with_other_salts_share_no_pages(llama_dir):
    engine = make_engine(llama_dir, page_size=4, num_pages=64)
    prompt = list(range(10, 30))  # 5 full pages
    run_all(engine, {"a": (prompt + [40], greedy(2))})
    other = engine.add_request("b", prompt + [41], greedy(2), cache_salt=SALT_A)
    assert engine.step()[0].num_cached_tokens == 0
    shared_pages = {node.page for node in engine.blocks.cache.match(prompt)}
    assert len(shared_pages) == 5 and not shared_pages & set(other.block_table)
    run_all(engine, {})
    same = engine.add_request("c", prompt + [42], greedy(2), cache_salt=SALT_A)
    assert engine.step()[0].num_cached_tokens == 20 and len(same.tree_nodes) == 5
    run_all(engine, {})
