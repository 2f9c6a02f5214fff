"""Padding, span checks and chunk interval arithmetic."""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from iris.multimodal import (
    Modality,
    MultimodalItem,
    check_spans,
    chunk_overlaps,
    pad_with_offsets,
)


def image(seed: int, offsets=()) -> MultimodalItem:
    item = MultimodalItem(Modality.IMAGE, offsets=list(offsets))
    item.set_identity(bytes([seed]) * 32)
    return item


def test_pad_with_offsets_keeps_length_and_input():
    ids = [1, 2, 9, 9, 9, 9, 9, 3, 9, 9, 4]
    original = list(ids)
    a, b = image(1, [(2, 6)]), image(2, [(8, 9)])
    out = pad_with_offsets(ids, [a, b])
    assert ids == original
    assert out.dtype == np.int64 and len(out) == len(ids)
    assert out[2:7].tolist() == a.padding_sequence(5)
    assert out[8:10].tolist() == b.padding_sequence(2)
    assert out[[0, 1, 7, 10]].tolist() == [1, 2, 3, 4]


def test_pad_with_offsets_does_not_mutate_numpy_input():
    ids = np.arange(10, dtype=np.int64)
    pad_with_offsets(ids, [image(3, [(1, 3)])])
    assert ids.tolist() == list(range(10))


def test_rotation_runs_on_across_spans_of_one_item():
    item = image(4, [(0, 2), (5, 6)])
    out = pad_with_offsets([0] * 8, [item])
    assert out[[0, 1, 2, 5, 6]].tolist() == item.padding_sequence(5)


@pytest.mark.parametrize(
    "offsets, message",
    [
        ([[(3, 2)]], "start > end"),
        ([[(-1, 2)]], "outside"),
        ([[(5, 10)]], "outside"),
        ([[(1, 4)], [(4, 6)]], "overlaps"),
        ([[(1, 4)], [(0, 1)]], "overlaps"),
    ],
)
def test_bad_spans_name_the_span(offsets, message):
    items = [image(i, spans) for i, spans in enumerate(offsets)]
    with pytest.raises(ValueError, match=message):
        check_spans(items, 10)


def test_chunk_overlaps_cut_an_item():
    # item 0 rows: span (2,4) -> rows 0..2, span (7,8) -> rows 3..4
    overlaps = chunk_overlaps([[(2, 4), (7, 8)], [(10, 12)]], 3, 11)
    assert [(o.item_index, o.src_start, o.dst_start, o.length) for o in overlaps] == [
        (0, 1, 0, 2),
        (0, 3, 4, 2),
        (1, 0, 7, 1),
    ]


spans_strategy = st.lists(st.tuples(st.integers(0, 60), st.integers(1, 8)), max_size=6).map(
    lambda pairs: sorted({start: size for start, size in pairs}.items())
)


@given(spans_strategy, st.integers(0, 80), st.integers(0, 40))
def test_chunk_overlaps_match_brute_force(pairs, chunk_start, chunk_len):
    offsets, cursor = [], 0
    for start, size in pairs:
        start = max(start, cursor)
        offsets.append((start, start + size - 1))
        cursor = start + size
    chunk_end = chunk_start + chunk_len
    covered = {p for s, e in offsets for p in range(s, e + 1)}
    expected = sum(1 for p in range(chunk_start, chunk_end) if p in covered)
    assert sum(o.length for o in chunk_overlaps([offsets], chunk_start, chunk_end)) == expected


@given(st.lists(st.integers(0, 5000), min_size=1, max_size=40), st.integers(0, 3))
def test_padding_property_length_and_text_preserved(ids, n_items):
    length = len(ids)
    items, cursor = [], 0
    for i in range(n_items):
        if cursor + 1 >= length:
            break
        end = min(length - 1, cursor + 2)
        items.append(image(i + 1, [(cursor, end)]))
        cursor = end + 2
    out = pad_with_offsets(ids, items)
    mask = np.zeros(length, dtype=bool)
    for item in items:
        for start, end in item.offsets:
            mask[start : end + 1] = True
    assert len(out) == length
    assert np.array_equal(out[~mask], np.array(ids)[~mask])
    assert (out[mask] >= 1_000_000).all()
