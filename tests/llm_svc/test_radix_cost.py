"""Radix cache cost and eviction order: operations touch only the request's nodes (counted
by the cache's `visited` counter, deterministically), a held page is never evicted, and
recently released prefixes outlive old ones."""

from __future__ import annotations

import random

from llm_svc.engine.radix_cache import RadixCache

PAGE = 2
FINGERPRINT = bytes(range(32))


def _filled(num_prefixes: int, depth: int, salts: int = 1) -> RadixCache:
    """`num_prefixes` released chains of `depth` pages under a shared first page, spread
    over `salts` namespaces: a full cache, nothing referenced."""
    cache, page = RadixCache(PAGE, FINGERPRINT), 0
    for i in range(num_prefixes):
        salt = b"" if i % salts == 0 else bytes([i % salts]) * 32
        nodes = []
        for d in range(depth):
            tokens = [0, 0] if d == 0 else [i, d]
            node, created = cache.insert(nodes[-1] if nodes else None, tokens, page, salt)
            if not created:
                cache.acquire([node])
            page += created
            nodes.append(node)
        cache.release(nodes)
    return cache


def _cost(cache: RadixCache, op, *args) -> tuple[int, object]:
    """(nodes `op(*args)` visited, its result)."""
    before = cache.visited
    result = op(*args)
    return cache.visited - before, result


def test_evict_visits_a_constant_per_page_whatever_the_cache_size():
    costs = []
    for num_prefixes in (16, 2048):
        cache = _filled(num_prefixes, depth=4, salts=8)
        assert cache.num_unreferenced >= num_prefixes * 3
        for k in (1, 8, 32):
            cost, _ = _cost(cache, cache.evict, k)
            assert cost <= 2 * k, f"evict({k}) visited {cost} nodes at {num_prefixes} prefixes"
            costs.append(cost)
    assert costs[:3] == costs[3:], "evict's cost depends on the cache's size"


def test_request_operations_visit_only_the_request_pages():
    for num_prefixes in (16, 1024):
        cache = _filled(num_prefixes, depth=4)
        ids = [0, 0, 5, 1, 5, 2, 5, 3, 9]  # prefix 5's four pages and a partial one
        cost, nodes = _cost(cache, cache.match, ids)
        assert cost <= 5 and len(nodes) == 4
        assert _cost(cache, cache.acquire, nodes)[0] == 4
        assert _cost(cache, cache.insert, nodes[-1], [7, 7], 10**6)[0] == 1
        assert _cost(cache, cache.release, nodes)[0] == 4


def test_a_node_in_use_is_never_evicted():
    rng = random.Random(7)
    cache, next_page, held = RadixCache(PAGE, FINGERPRINT), 0, []
    for _ in range(400):
        # A request: match a random prefix, hold it, extend it by fresh pages.
        ids = [rng.randrange(3) for _ in range(PAGE * rng.randint(1, 6))]
        salt = rng.choice([b"", b"a" * 32])
        nodes = cache.match(ids, salt)
        cache.acquire(nodes)
        for start in range(len(nodes) * PAGE, len(ids), PAGE):
            node, created = cache.insert(
                nodes[-1] if nodes else None, ids[start : start + PAGE], next_page, salt
            )
            assert created
            next_page += 1
            nodes.append(node)
        held.append(nodes)
        if rng.random() < 0.5:
            cache.release(held.pop(rng.randrange(len(held))))
        held_pages = {node.page for nodes in held for node in nodes}
        freed = cache.evict(rng.randint(0, 3))
        assert not held_pages & set(freed)
    # Everything unreferenced can go, and then exactly the held pages remain.
    held_pages = {node.page for nodes in held for node in nodes}
    unreferenced = cache.num_unreferenced
    assert len(cache.evict(unreferenced + 5)) == unreferenced
    assert cache.pages() == held_pages and cache.num_unreferenced == 0


def test_recently_used_prefixes_outlive_old_ones():
    cache = _filled(20, depth=3)  # prefix i released i-th; page [0, 0] shared
    for i in range(5):  # the five oldest are used again
        nodes = cache.match([0, 0, i, 1, i, 2])
        cache.acquire(nodes)
        cache.release(nodes)
    cache.evict(20)  # ten prefixes' two private pages each
    alive = [i for i in range(20) if len(cache.match([0, 0, i, 1, i, 2])) == 3]
    assert alive == [0, 1, 2, 3, 4, 15, 16, 17, 18, 19]


def test_an_emptied_namespace_is_dropped_by_the_eviction_that_empties_it():
    cache = _filled(64, depth=1, salts=64)  # one page in each of 63 tenant namespaces
    assert len(cache.roots) == 64
    assert _cost(cache, cache.evict, 64)[0] == 64
    assert set(cache.roots) == {b""} and cache.num_nodes == 0
