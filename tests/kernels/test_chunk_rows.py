"""dest_rows_for_chunk against a brute-force walk over positions, and end to end with scatter."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from iris_kernels import dest_rows_for_chunk, scatter_rows


def brute_force(offsets_per_item, chunk_start, chunk_end):
    """(chunk row, item, item row) for every image position of the chunk, walking positions."""
    owner = {}
    for item, spans in enumerate(offsets_per_item):
        row = 0
        for start, end in spans:
            for position in range(start, end + 1):
                owner[position] = (item, row)
                row += 1
    return [
        (position - chunk_start, *owner[position])
        for position in range(chunk_start, chunk_end)
        if position in owner
    ]


def planned(plan):
    triples = []
    for piece in plan.pieces:
        for k in range(piece.length):
            triples.append((piece.dst_start + k, piece.item_index, piece.src_start + k))
    assert [t[0] for t in triples] == plan.dest_rows.tolist()
    return triples


@st.composite
def items_in_sequence(draw):
    """Items with one or more non-overlapping spans (tiles) laid along a sequence."""
    length = draw(st.integers(1, 60))
    cuts = sorted(draw(st.sets(st.integers(0, length), max_size=16)))
    spans = [(a, b - 1) for a, b in zip(cuts[::2], cuts[1::2], strict=False) if b > a]
    item_of_span = [draw(st.integers(0, 3)) for _ in spans]
    offsets = [[s for s, i in zip(spans, item_of_span, strict=True) if i == k] for k in range(4)]
    return length, offsets


@settings(max_examples=60, deadline=None)
@given(case=items_in_sequence(), data=st.data())
def test_matches_brute_force(case, data):
    length, offsets = case
    start = data.draw(st.integers(0, length))
    end = data.draw(st.integers(start, length + 3))
    plan = dest_rows_for_chunk(offsets, start, end)
    assert planned(plan) == brute_force(offsets, start, end)
    assert plan.dest_rows.dtype == torch.int64 and plan.dest_rows.device.type == "cpu"
    assert plan.num_rows == plan.dest_rows.numel()
    assert plan.item_indices == tuple(sorted({p.item_index for p in plan.pieces}))


@pytest.mark.parametrize("backend", ["triton", "torch"])
def test_gather_and_scatter_assemble_the_chunk(backend):
    # Item 0: one span; item 1: two tiles; the chunk [4, 20) cuts both.
    offsets = [[(2, 6)], [(9, 11), (15, 22)]]
    hidden = 5
    embeddings = [
        torch.arange(5 * hidden, dtype=torch.float32).reshape(5, hidden) + 100,
        torch.arange(11 * hidden, dtype=torch.float32).reshape(11, hidden) + 1000,
    ]
    plan = dest_rows_for_chunk(offsets, 4, 20)
    chunk = torch.zeros(16, hidden)
    scatter_rows(chunk, plan.gather(embeddings), plan.dest_rows, backend=backend)
    for chunk_row, item, item_row in brute_force(offsets, 4, 20):
        assert torch.equal(chunk[chunk_row], embeddings[item][item_row])
    text_rows = [r for r in range(16) if r + 4 not in (*range(2, 7), *range(9, 12), *range(15, 23))]
    assert chunk[text_rows].abs().sum() == 0


def test_gather_refuses_short_embeddings():
    plan = dest_rows_for_chunk([[(0, 3)], [(4, 9)]], 2, 8)
    with pytest.raises(ValueError, match=r"item 1 embedding has 3 rows; chunk needs rows \[0, 4\)"):
        plan.gather([torch.zeros(4, 2), torch.zeros(3, 2)])
    with pytest.raises(ValueError, match="item 0 embedding has None rows"):
        plan.gather([None, torch.zeros(6, 2)])


def test_chunk_without_images():
    plan = dest_rows_for_chunk([[(0, 3)]], 4, 10)
    assert plan.num_rows == 0 and plan.pieces == () and plan.item_indices == ()
    with pytest.raises(ValueError, match="no image rows"):
        plan.gather([torch.zeros(4, 2)])


@pytest.mark.parametrize(("start", "end"), [(-1, 3), (5, 4)])
def test_bad_chunk_range(start, end):
    with pytest.raises(ValueError, match="not a valid range"):
        dest_rows_for_chunk([[(0, 3)]], start, end)
