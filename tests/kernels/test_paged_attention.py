"""The Triton attention backend (interpreted) against its torch twin, the SDPA backend.

Each case is one packed step: a list of (context length, query length) sequences whose
pages are scattered over the cache in a shuffled order, so page boundaries, ragged lengths,
chunks starting mid-page and decode rows mixed with prefill chunks are all exercised. Both
backends get identical caches and inputs; their outputs and the caches they write must match.
"""

import pytest
import torch

import iris_kernels
from iris_kernels.paged_attention_decode import split_plan
from llm_svc.engine.attention import AttentionMetadata, KVCache
from llm_svc.engine.attention.sdpa import SdpaBackend
from llm_svc.engine.attention.triton import TritonBackend

TOLERANCE = {torch.float32: 2e-5, torch.float16: 2e-3, torch.bfloat16: 2e-2}


def make_step(seqs, page_size, num_pages, kv_heads, head_dim, dtype, seed):
    """A random cache (two layers) and the metadata of one step over `seqs`."""
    generator = torch.Generator().manual_seed(seed)
    cache = KVCache.allocate(2, num_pages, page_size, kv_heads, head_dim, dtype, "cpu")
    cache.k.copy_(torch.randn(cache.k.shape, generator=generator))
    cache.v.copy_(torch.randn(cache.v.shape, generator=generator))
    free = torch.randperm(num_pages, generator=generator).tolist()
    tables, slots, starts, flat = [], [], [], 0
    for context, query_len in seqs:
        table = [free.pop() for _ in range(-(-context // page_size))]
        tables.append(table)
        slots += [table[p // page_size] * page_size + p % page_size
                  for p in range(context - query_len, context)]  # fmt: skip
        starts.append(flat)
        flat += query_len
    width = max(len(table) for table in tables)
    meta = AttentionMetadata(
        slot_mapping=torch.tensor(slots),
        query_starts=starts,
        query_lens=[q for _, q in seqs],
        context_lens=[c for c, _ in seqs],
        block_tables=torch.tensor([t + [0] * (width - len(t)) for t in tables]),
    )
    return cache, meta, flat, generator


def attend_until(seqs, spans) -> torch.Tensor:
    """[T] the last position each flat token sees: itself, or its span's last position.
    `spans[i]`: sequence i's half-open image spans (absolute positions, inside its chunk)."""
    until = []
    for (context, query_len), seq_spans in zip(seqs, spans, strict=True):
        row = list(range(context - query_len, context))
        for start, end in seq_spans:
            for position in range(start, end):
                row[position - (context - query_len)] = end - 1
        until += row
    return torch.tensor(until)


def compare(seqs, *, page_size=4, kv_heads=2, group=2, head_dim=16, dtype=torch.float32,
            seed=0, num_pages=None, device="cpu", spans=None, **attention):  # fmt: skip
    """Run one step through both backends on `device`; assert equal outputs and caches.
    `attention`: the layer's `scale` and `window`, passed to both; `spans`: per sequence,
    its bidirectional image spans (see `attend_until`). Returns (q, k, v, the caches, meta,
    the output)."""
    num_pages = num_pages or sum(-(-c // page_size) for c, _ in seqs) + 3
    cache, meta, tokens, generator = make_step(
        seqs, page_size, num_pages, kv_heads, head_dim, dtype, seed
    )
    if spans is not None:
        meta.attend_until = attend_until(seqs, spans).to(device)
    cache = KVCache(cache.k.to(device), cache.v.to(device), page_size)
    meta.slot_mapping, meta.block_tables = (
        meta.slot_mapping.to(device),
        meta.block_tables.to(device),
    )
    twin = KVCache(cache.k.clone(), cache.v.clone(), page_size)
    q = torch.randn(tokens, kv_heads * group, head_dim, generator=generator).to(device, dtype)
    k = torch.randn(tokens, kv_heads, head_dim, generator=generator).to(device, dtype)
    v = torch.randn(tokens, kv_heads, head_dim, generator=generator).to(device, dtype)
    triton_backend, sdpa = TritonBackend(cache), SdpaBackend(twin)
    triton_backend.plan(meta)
    sdpa.plan(meta)
    for layer in (0, 1):
        got = triton_backend.forward(layer, q, k, v, **attention)
        expected = sdpa.forward(layer, q, k, v, **attention)
        torch.testing.assert_close(got, expected, atol=TOLERANCE[dtype], rtol=TOLERANCE[dtype])
    assert torch.equal(cache.k, twin.k) and torch.equal(cache.v, twin.v)
    return q, twin, meta, expected


def test_mixed_decode_and_extend_in_one_step(runs_on):
    # Decodes of 1 position, a page exactly, across pages; a fresh prefill; a chunk that
    # starts mid-page after a cached prefix; a 1-token "chunk" counted as decode; a decode
    # over several key tiles (BLOCK_N = 64), so the online softmax rescales.
    seqs = [(1, 1), (4, 1), (9, 1), (7, 7), (14, 5), (3, 1), (150, 1)]
    with (
        runs_on("paged_decode_attention", "triton", times=2),
        runs_on("paged_extend_attention", "triton", times=2),
    ):
        compare(seqs)


@pytest.mark.parametrize("group", [1, 2, 3, 4, 8])
def test_gqa_ratios(group):
    compare([(6, 1), (11, 1), (10, 6)], kv_heads=1 if group == 8 else 2, group=group)


@pytest.mark.parametrize("head_dim", [64, 128])
def test_head_dims(head_dim):
    compare([(5, 1), (13, 1), (12, 9)], head_dim=head_dim, page_size=8, seed=head_dim)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_dtypes(dtype):
    compare([(3, 1), (17, 1), (9, 4), (6, 6)], dtype=dtype)


def test_ragged_chunks_longer_than_one_query_block():
    # 70 and 66 rows: two query blocks each (BLOCK_M = 64 for head dim 16), the second
    # partial; the cached prefix of the second starts mid-page; plus a short chunk.
    compare([(70, 70), (71, 66), (5, 2)], page_size=8)


def test_split_k_over_long_contexts(monkeypatch):
    # Force several splits per sequence (the merge kernel runs), each over several key
    # tiles, short contexts included so some splits see nothing.
    monkeypatch.setattr("iris_kernels.paged_attention_decode.MIN_SPLIT_TOKENS", 128, raising=True)
    assert split_plan(400, 128) == (3, 144)
    before = iris_kernels.CALLS[("paged_decode_attention", "triton")]
    compare([(400, 1), (2, 1), (150, 1)], page_size=8)
    assert iris_kernels.CALLS[("paged_decode_attention", "triton")] - before == 2


def test_split_plan_covers_the_longest_context():
    for context in (1, 15, 16, 255, 256, 1000, 70000):
        splits, split_len = split_plan(context, 256)
        assert 1 <= splits <= 16 and split_len % 16 == 0
        assert (splits - 1) * split_len < context <= splits * split_len


def test_planning_a_step_reads_nothing_back_from_the_device():
    # On the meta device a tensor has no values: any int(), .item() or .tolist() of one
    # raises, so planning there proves the plans use only the host-side lengths.
    cache, meta, _, _ = make_step([(9, 1), (14, 5), (3, 3)], 4, 12, 2, 16, torch.float32, 0)
    meta.slot_mapping, meta.block_tables = (
        meta.slot_mapping.to("meta"),
        meta.block_tables.to("meta"),
    )
    cache = KVCache(cache.k.to("meta"), cache.v.to("meta"), 4)
    for backend in (SdpaBackend(cache), TritonBackend(cache)):
        backend.plan(meta)


def test_unsupported_head_dim_or_dtype_is_refused():
    with pytest.raises(ValueError, match="head dim 24"):
        TritonBackend(KVCache.allocate(1, 2, 4, 1, 24, torch.float32, "cpu"))
    with pytest.raises(ValueError, match="float64"):
        TritonBackend(KVCache.allocate(1, 2, 4, 1, 16, torch.float64, "cpu"))


@pytest.mark.parametrize("window", [1, 3, 8, 70])
def test_sliding_window_decode_and_extend(window):
    # Windows shorter than a page, than a chunk, than a key tile, and longer than some
    # contexts; decodes and chunks after a long cached prefix (q - k < window).
    seqs = [(1, 1), (9, 1), (150, 1), (7, 7), (40, 5), (100, 30), (20, 1)]
    compare(seqs, window=window)
    compare(seqs, window=window, scale=0.3)


def test_sliding_window_with_split_k_and_wide_heads(monkeypatch):
    # Head dim 128: key tiles (32) narrower than query blocks (64), so a block's later rows
    # see nothing in its first tiles; decode split over several splits, some before the
    # window (they see nothing and weigh nothing in the merge).
    import iris_kernels.paged_attention_decode as decode

    monkeypatch.setattr(decode, "MIN_SPLIT_TOKENS", 16)
    compare([(200, 1), (90, 70), (33, 1)], head_dim=128, window=24)


def hf_mask(length: int, spans, window: int | None) -> torch.Tensor:
    """[length, length] Gemma 3's mask as transformers 5.24 composes it from its own mask
    functions: causal OR same image block, AND the sliding window on sliding layers."""
    from transformers.masking_utils import (
        and_masks,
        blockwise_overlay,
        causal_mask_function,
        or_masks,
        sliding_window_overlay,
    )

    blocks = torch.full((1, length), -1)
    for index, (start, end) in enumerate(spans):
        blocks[0, start:end] = index
    function = or_masks(causal_mask_function, blockwise_overlay(blocks))
    if window is not None:
        function = and_masks(sliding_window_overlay(window), function)
    q, k = torch.arange(length)[:, None], torch.arange(length)[None, :]
    return function(torch.tensor(0), torch.tensor(0), q, k).expand(length, length)


@pytest.mark.parametrize("window", [None, 3, 8])
def test_image_spans_attend_both_ways_as_transformers_masks_them(window):
    # Chunks holding whole spans: after a cached prefix, from position 0, a span at the
    # chunk's end, spans longer than the window and than a query block (64 rows), beside
    # decode rows. Triton equals SDPA; SDPA's output on a fresh prefill equals dense
    # attention under transformers' own mask.
    seqs = [(9, 1), (30, 30), (50, 20), (120, 100), (7, 1)]
    spans = [[], [(3, 10), (12, 30)], [(31, 40), (44, 50)], [(25, 95), (97, 110)], []]
    q, cache, meta, out = compare(seqs, spans=spans, window=window, scale=0.5)
    start, length = meta.query_starts[1], 30
    table = meta.block_tables[1, : -(-length // 4)]
    keys = cache.k[1].view(-1, 4, *cache.k.shape[2:])[table].reshape(-1, *cache.k.shape[2:])
    values = cache.v[1].view(-1, 4, *cache.v.shape[2:])[table].reshape(-1, *cache.v.shape[2:])
    query = q[start : start + length].transpose(0, 1)  # [heads, n, d]
    keys = keys[:length].repeat_interleave(2, dim=1).transpose(0, 1)
    values = values[:length].repeat_interleave(2, dim=1).transpose(0, 1)
    scores = (query @ keys.transpose(1, 2)) * 0.5
    scores = scores.masked_fill(~hf_mask(length, spans[1], window), float("-inf"))
    dense = (scores.softmax(-1) @ values).transpose(0, 1)
    torch.testing.assert_close(out[start : start + length], dense, atol=2e-5, rtol=2e-5)


def test_image_spans_change_the_output():
    """Guard: the same step without spans gives another answer for the image rows."""
    seqs = [(30, 30)]
    *_, both_ways = compare(seqs, spans=[[(3, 10)]])
    *_, causal = compare(seqs)
    assert not torch.allclose(both_ways[3:9], causal[3:9], atol=1e-3)
    torch.testing.assert_close(both_ways[10:], causal[10:])
