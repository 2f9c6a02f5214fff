"""Scheduler decisions on their own (no model): budget, mixing, preemption order."""

from __future__ import annotations

from llm_svc.engine import EngineConfig, SamplingParams
from llm_svc.engine.block_manager import BlockManager
from llm_svc.engine.radix_cache import RadixCache
from llm_svc.engine.scheduler import Scheduler
from llm_svc.engine.sequence import Sequence, SequenceStatus


def _scheduler(model_dir, num_pages=32, budget=8, max_seqs=4):
    config = EngineConfig(
        model_dir, page_size=4, max_num_batched_tokens=budget, max_num_seqs=max_seqs
    )
    blocks = BlockManager(num_pages, 4, RadixCache(4, bytes(32)))
    return Scheduler(config, blocks)


def _step(scheduler, sampled=7):
    """Pretend the model ran: mark chunks computed, append a token where one is sampled."""
    out = scheduler.schedule()
    for chunk in out.chunks:
        chunk.seq.num_computed_tokens += chunk.num_tokens
        scheduler.blocks.commit(chunk.seq)
        if chunk.seq.num_computed_tokens == chunk.seq.num_tokens:
            chunk.seq.append_token(sampled)
    return out


def test_chunked_prefill_fills_the_budget_and_mixes_with_decode(llama_dir):
    scheduler = _scheduler(llama_dir, budget=8)
    a = Sequence("a", list(range(6)), SamplingParams())
    b = Sequence("b", list(range(100, 120)), SamplingParams())
    scheduler.add(a)
    scheduler.add(b)
    first = _step(scheduler)
    assert [(c.seq.request_id, c.start, c.num_tokens) for c in first.chunks] == [
        ("a", 0, 6),
        ("b", 0, 2),
    ]
    second = _step(scheduler)
    # a decodes (1 token) first, b's prefill takes the rest of the budget.
    assert [(c.seq.request_id, c.start, c.num_tokens) for c in second.chunks] == [
        ("a", 6, 1),
        ("b", 2, 7),
    ]


def test_max_num_seqs_limits_admission(llama_dir):
    scheduler = _scheduler(llama_dir, budget=64, max_seqs=2)
    for i in range(3):
        scheduler.add(Sequence(str(i), [i] * 3, SamplingParams()))
    out = scheduler.schedule()
    assert [c.seq.request_id for c in out.chunks] == ["0", "1"]
    assert [s.request_id for s in scheduler.waiting] == ["2"]


def test_preemption_takes_the_newest_and_requeues_it_first(llama_dir):
    scheduler = _scheduler(llama_dir, num_pages=4, budget=64)
    old = Sequence("old", list(range(8)), SamplingParams())  # 2 pages
    new = Sequence("new", list(range(50, 57)), SamplingParams())  # 2 pages
    scheduler.add(old)
    scheduler.add(new)
    _step(scheduler)
    out = _step(scheduler)  # old's 9th token needs a third page: new must go
    assert [s.request_id for s in out.preempted] == ["new"]
    assert [c.seq.request_id for c in out.chunks] == ["old"]
    assert new.status is SequenceStatus.WAITING and new.num_computed_tokens == 0
    assert new.token_ids[-1] == 7  # its generated token is kept and will be prefilled
    assert scheduler.waiting[0] is new and scheduler.num_preemptions == 1


def test_pending_prefill_counts_what_the_prefix_cache_does_not_hold(llama_dir):
    scheduler = _scheduler(llama_dir, budget=64, max_seqs=1)
    first = Sequence("first", list(range(16)), SamplingParams())
    scheduler.add(first)
    _step(scheduler)  # 16 tokens computed; 4 full pages published to the cache
    # The next turn resends the 16 tokens plus 6 new ones; it waits (max_seqs=1). The
    # cache holds its first 16 tokens, so only 6 remain to prefill.
    turn = Sequence("turn", [*range(16), 90, 91, 92, 93, 94, 95], SamplingParams())
    stranger = Sequence("stranger", list(range(200, 210)), SamplingParams())
    scheduler.add(turn)
    scheduler.add(stranger)
    assert scheduler.pending_prefill_tokens() == 6 + 10


def test_prefixes_held_by_the_queue_never_leave_its_head_without_room(llama_dir):
    """A waiting sequence keeps the prefix it matched (as one whose embeddings were fetched
    does). With nothing running, the head of the queue gets the pages the sequences behind
    it hold, rather than the queue waiting on itself for ever."""
    scheduler = _scheduler(llama_dir, num_pages=6, budget=64)
    history = list(range(100, 124))  # 6 full pages: the whole pool
    first = Sequence("first", history, SamplingParams())
    scheduler.add(first)
    out = scheduler.schedule()
    first.num_computed_tokens += out.chunks[0].num_tokens
    scheduler.blocks.commit(first)
    scheduler.finish(first)  # its pages stay cached, unreferenced
    head = Sequence("head", list(range(8)), SamplingParams())
    behind = Sequence("behind", history + [1, 2, 3, 4], SamplingParams())
    scheduler.add(head)
    scheduler.add(behind)
    scheduler.blocks.match_prefix(behind)  # holds all 6 pages while it waits
    assert len(behind.block_table) == 6
    out = scheduler.schedule()
    assert [c.seq.request_id for c in out.chunks] == ["head"]
    assert behind.block_table == [] and behind.num_computed_tokens == 0
