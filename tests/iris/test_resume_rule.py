"""The resumable-prefix rule's cases (iris.multimodal.PrefixResumeRule): what exists today
(all full attention; sliding layers, which resume only over a whole window of their pages),
what the pages held allow, and spans that must not be cut."""

import pytest

from iris.multimodal import (
    AttentionLayer,
    LayerKind,
    PrefixResumeRule,
    all_full,
    layers_from_windows,
)

PAGE = 4


def test_all_full_attention_leaves_the_last_token_to_compute():
    rule = PrefixResumeRule(PAGE, all_full(3))
    assert [rule.resumable_blocks(n) for n in (0, 1, 4, 5, 8, 9)] == [0, 0, 0, 1, 1, 2]
    assert rule.resumable_tokens(9) == 8


def test_no_layers_reported_is_all_full():
    assert (
        PrefixResumeRule(PAGE).resumable_blocks(13)
        == PrefixResumeRule(PAGE, all_full(2)).resumable_blocks(13)
        == 3
    )


def test_no_more_than_the_leading_blocks_held():
    rule = PrefixResumeRule(PAGE, all_full(2))
    assert [rule.resumable_blocks(17, held_blocks=h) for h in (0, 1, 3, 4, 9)] == [0, 1, 3, 4, 4]


def test_sliding_layers_keep_every_page_so_resume_as_full_ones_do():
    mixed = PrefixResumeRule(PAGE, layers_from_windows([8, None, 8, 8]))
    full = PrefixResumeRule(PAGE, all_full(4))
    for n in range(40):
        for held in (None, 0, 2, 5, 20):
            assert mixed.resumable_blocks(n, held) == full.resumable_blocks(n, held)
    assert mixed.layers[0] == AttentionLayer(LayerKind.SLIDING, 8)
    assert mixed.layers[1] == AttentionLayer(LayerKind.FULL)


def test_a_resume_point_never_falls_inside_a_span_that_must_not_be_cut():
    rule = PrefixResumeRule(PAGE, all_full(1))
    # 20 tokens: at most 4 blocks (16 tokens). A span [14, 18) holds 16 inside it.
    assert rule.resumable_blocks(20, uncut_spans=[(14, 18)]) == 3
    # A span ending exactly at the resume point, or starting at it, does not move it.
    assert rule.resumable_blocks(20, uncut_spans=[(12, 16), (16, 19)]) == 4
    # Backing off out of one span into an earlier one backs off again.
    assert rule.resumable_blocks(20, uncut_spans=[(2, 13), (14, 18)]) == 0
    # The cut comes after what is held: 2 blocks held (8 tokens), a span [6, 10).
    assert rule.resumable_blocks(20, held_blocks=2, uncut_spans=[(6, 10)]) == 1


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: PrefixResumeRule(0), "page_size must be > 0, got 0"),
        (lambda: AttentionLayer(LayerKind.SLIDING, 0), "needs a window > 0, got 0"),
        (lambda: AttentionLayer(LayerKind.FULL, 512), "has no window, got 512"),
        (lambda: PrefixResumeRule(PAGE).resumable_blocks(-1), "num_tokens must be >= 0, got -1"),
    ],
)
def test_bad_facts_are_refused_by_value(make, message):
    with pytest.raises(ValueError, match=message):
        make()


def test_a_sliding_layer_resumes_only_over_a_whole_window_of_its_pages():
    # Window 8, pages of 4: resuming after d blocks reads blocks d - 2 and d - 1.
    rule = PrefixResumeRule(4, (AttentionLayer(LayerKind.SLIDING, 8), AttentionLayer()))
    kept = [False, False, True, True, False, True, True, True]
    windows = kept.__getitem__
    assert rule.resumable_blocks(33, windows=windows) == 8
    assert rule.resumable_blocks(33, held_blocks=5, windows=windows) == 4  # 4 lost its page
    assert rule.resumable_blocks(33, held_blocks=2, windows=windows) == 0
    assert rule.resumable_blocks(33, held_blocks=5) == 5  # nothing says a page is gone
    assert rule.resumable_blocks(33, windows=lambda b: kept[b] and b != 6) == 4
