"""Radix prefix cache at scale (issue 35): what match, acquire, insert, release and evict
cost per page in a full cache of 10³, 10⁴, 10⁵ and 10⁶ pages, side by side in one run.

    .venv/bin/python bench/radix.py [--sizes 1000,10000,100000,1000000] [--rounds 5]

Each size is filled, then measured, with the same seeded workload: 1,000 shared system
prompts (2 to 16 pages) drawn by Zipf popularity (s = 1), each request in one of 64 salts
(the shared namespace and 63 tenants), a user turn of 1 to 6 pages, and in a third of the
turns an image span (4 to 16 pages of an image's rotating sentinels, from a pool of 5,000
images). The fill runs such requests until the cache holds 98% of the size's pages. Then,
with the cache full (new pages come from `evict`), steps of 16 requests in a fixed, seeded
mix: 40% hit (a recent request resent with a new one-page question), 30% extend (a recent
conversation with a new 2-8 page turn), 30% miss (a prompt nobody sent, in a salt drawn at
random). A step's requests hold their pages until the next step's are admitted, as on a
pod. Each round runs `--steps` steps on every size in turn; each op keeps its best round.
Costs are the thread's CPU time (time.thread_time), so waiting for a core on a shared
machine is not charged to the cache.

Prints, per size, each op's CPU time per page (match: per page looked up, the first miss
included; acquire, insert, release: per page; evict: per page freed); the memory the
largest cache's index takes; then for each op `radix: <op> cost per page at 1e6 / at 1e3
= R` (target R <= 3: Python objects at 10⁶ nodes miss the CPU caches more than at 10³, so
some rise is physical; the deterministic bound is tests/llm_svc/test_radix_cost.py).
"""

from __future__ import annotations

import argparse
import gc
import random
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from iris.multimodal.item import pad_values_for  # noqa: E402
from llm_svc.engine.radix_cache import RadixCache  # noqa: E402

PAGE = 16
NUM_PROMPTS = 1000
NUM_SALTS = 64
NUM_IMAGES = 5000
BATCH = 16  # requests admitted per step
OPS = ("match", "acquire", "insert", "release", "evict")
VOCAB = 49152


class Workload:
    """The seeded request stream: (salt, token ids) per request."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        np_rng = np.random.default_rng(seed)
        self.prompts = [
            np_rng.integers(0, VOCAB, PAGE * int(np_rng.integers(2, 17))).tolist()
            for _ in range(NUM_PROMPTS)
        ]
        weights = 1.0 / np.arange(1, NUM_PROMPTS + 1)
        self.cum = np.cumsum(weights / weights.sum()).tolist()
        self.salts = [b""] + [bytes([i]) * 32 for i in range(1, NUM_SALTS)]
        self.images = [pad_values_for(i.to_bytes(8, "big")) for i in range(NUM_IMAGES)]
        self.recent: list[tuple[bytes, list[int]]] = []

    def _tokens(self, pages: int) -> list[int]:
        rng = self.rng
        return [rng.randrange(VOCAB) for _ in range(pages * PAGE)]

    def _user_turn(self, pages: int) -> list[int]:
        ids = self._tokens(pages)
        if self.rng.random() < 1 / 3:  # an image span inside the turn
            values = self.images[self.rng.randrange(NUM_IMAGES)]
            span = PAGE * self.rng.randint(4, 16)
            at = self.rng.randrange(len(ids) + 1)
            ids[at:at] = [values[i % 4] for i in range(span)]
        return ids + [self.rng.randrange(VOCAB)]  # and a partial page

    def fresh(self) -> tuple[bytes, list[int]]:
        rng = self.rng
        prompt = self.prompts[_zipf_index(self.cum, rng.random())]
        salt = self.salts[rng.randrange(NUM_SALTS)]
        return self._remember(salt, prompt + self._user_turn(rng.randint(1, 6)))

    def mixed(self) -> tuple[bytes, list[int]]:
        rng, roll = self.rng, self.rng.random()
        if roll < 0.4 and self.recent:  # hit: resent, with a new one-page question
            salt, ids = self.recent[rng.randrange(len(self.recent))]
            return self._remember(salt, ids[:-1] + self._tokens(1) + [1])
        if roll < 0.7 and self.recent:  # extend: a new turn on a recent conversation
            salt, ids = self.recent[rng.randrange(len(self.recent))]
            return self._remember(salt, ids + self._user_turn(rng.randint(2, 8)))
        # miss: a prompt nobody sent
        salt = self.salts[rng.randrange(NUM_SALTS)]
        return self._remember(salt, self._tokens(rng.randint(2, 16)) + self._user_turn(2))

    def _remember(self, salt: bytes, ids: list[int]) -> tuple[bytes, list[int]]:
        if len(ids) > 48 * PAGE:  # a conversation this long starts over
            ids = ids[: 4 * PAGE] + ids[-1:]
        self.recent.append((salt, ids))
        if len(self.recent) > 4096:
            del self.recent[:2048]
        return salt, ids


def _zipf_index(cum: list[float], u: float) -> int:
    lo, hi = 0, len(cum) - 1
    while lo < hi:
        mid = (lo + hi) // 2
        if cum[mid] < u:
            lo = mid + 1
        else:
            hi = mid
    return lo


class Pod:
    """A radix cache of `capacity` pages run as the engine runs it, one step at a time: the
    step's requests match and hold their cached prefixes, the previous step's requests
    end (release), pages are evicted for what is new, and the new pages are inserted. Per
    op: the thread's CPU time and the pages it handled (CPU time, not wall time: on a
    shared machine the process waits for a core, which no operation of the cache costs)."""

    def __init__(self, capacity: int, seed: int) -> None:
        self.cache = RadixCache(PAGE, bytes(32))
        self.workload = Workload(seed)
        self.capacity = capacity
        self.free = list(range(capacity))
        self.running: list[list] = []
        self.reset_counts()

    def reset_counts(self) -> None:
        self.time = dict.fromkeys(OPS, 0.0)
        self.pages = dict.fromkeys(OPS, 0)

    def _add(self, op: str, start: float, pages: int) -> None:
        self.time[op] += time.thread_time() - start
        self.pages[op] += pages

    def step(self, requests: list[tuple[bytes, list[int]]]) -> None:
        cache, clock = self.cache, time.thread_time
        start = clock()
        matched = [cache.match(ids[:-1], salt) for salt, ids in requests]
        self._add("match", start, sum(len(nodes) + 1 for nodes in matched))
        start = clock()
        for nodes in matched:
            cache.acquire(nodes)
        self._add("acquire", start, sum(len(nodes) for nodes in matched))
        done, self.running = self.running, []
        start = clock()
        for nodes in done:
            cache.release(nodes)
        self._add("release", start, sum(len(nodes) for nodes in done))
        new = [
            (len(ids) - 1) // PAGE - len(nodes)
            for (_, ids), nodes in zip(requests, matched, strict=True)
        ]
        if sum(new) > len(self.free):
            start = clock()
            freed = cache.evict(sum(new) - len(self.free))
            self._add("evict", start, len(freed))
            self.free.extend(freed)
        inserted, start = 0, clock()
        for (salt, ids), nodes, count in zip(requests, matched, new, strict=True):
            for index in range(len(nodes), len(nodes) + min(count, len(self.free))):
                parent = nodes[-1] if nodes else None
                page = self.free.pop()
                tokens = ids[index * PAGE : (index + 1) * PAGE]
                node, created = cache.insert(parent, tokens, page, salt)
                if not created:  # a request earlier in this step cached it: share that page
                    cache.acquire([node])
                    self.free.append(page)
                nodes.append(node)
                inserted += 1
            self.running.append(nodes)
        self._add("insert", start, inserted)
        cache.take_events()  # the pod publishes them after each step

    def fill(self) -> None:
        while self.cache.num_nodes < self.capacity * 0.98:
            self.step([self.workload.fresh() for _ in range(BATCH)])


def index_bytes(cache: RadixCache) -> int:
    """The index's Python objects, by sys.getsizeof: nodes (the eviction queue is threaded
    through them), child dicts, key tuples, block hashes, and each key's token ints above
    the small-int cache (counted once per key slot: an upper bound, since keys may share
    int objects)."""
    total = sum(sys.getsizeof(r) for r in cache.roots.values())
    for node in cache._nodes():
        total += sys.getsizeof(node) + sys.getsizeof(node.children)
        total += sys.getsizeof(node.key) + sys.getsizeof(node.block_hash)
        total += sum(28 for token in node.key if token > 256)
    return total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="1000,10000,100000,1000000")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=40, help="steps per size per round")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    sizes = sorted(int(s) for s in args.sizes.split(","))
    pods = {}
    for size in sizes:
        start = time.perf_counter()
        pods[size] = Pod(size, args.seed)
        pods[size].fill()
        print(f"{size:>8} pages filled in {time.perf_counter() - start:.1f} s", flush=True)
    # Rounds alternate the sizes, and each op keeps its best round: other processes then
    # slow every size alike rather than whichever ran during a busy spell.
    best = {size: dict.fromkeys(OPS, float("inf")) for size in sizes}
    gc.disable()  # a collection in one op's timing would be charged to it
    for _ in range(args.rounds):
        for size, pod in pods.items():
            pod.reset_counts()
            for _ in range(args.steps):
                pod.step([pod.workload.mixed() for _ in range(BATCH)])
            for op in OPS:
                if pod.pages[op]:
                    best[size][op] = min(best[size][op], pod.time[op] / pod.pages[op])
    gc.enable()
    for size in sizes:
        cells = ", ".join(f"{op} {best[size][op] * 1e9:.0f} ns" for op in OPS)
        print(f"{size:>8} pages, per page: {cells}")
    large = pods[max(sizes)].cache
    held = index_bytes(large)
    print(f"index of the {large.num_nodes}-page cache: {held / 2**20:.0f} MiB "
          f"({held / large.num_nodes:.0f} B per page)")  # fmt: skip
    small, big = min(sizes), max(sizes)
    for op in OPS:
        ratio = best[big][op] / best[small][op]
        print(f"radix: {op} cost per page at {_short(big)} / at {_short(small)} = {ratio:.2f}")


def _short(size: int) -> str:
    """1000000 -> 1e6 (a power of ten), else the number."""
    text = f"{size:d}"
    return f"1e{len(text) - 1}" if text.strip("0") == "1" else text


if __name__ == "__main__":
    main()
