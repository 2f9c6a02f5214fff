"""The workload benchmark's plan, arrivals and turn classification (bench/workload.py):
pure functions, no platform. The benchmark's figures rest on these being what its
docstring says: counts fixed by the shape, arrivals at the stated rate, and turns with an
image the platform never saw told apart from those it was sent before."""

import math

import pytest

from bench.workload import (
    DEFAULT_SHAPE,
    TurnResult,
    WorkloadShape,
    arrival_gaps,
    build_plan,
    gateway_for,
    question,
    turns_by_image_novelty,
)


@pytest.mark.parametrize("seed", range(5))
def test_plan_counts_are_fixed_by_the_shape(seed):
    shape = DEFAULT_SHAPE
    plan = build_plan(shape, seed)
    assert len(plan) == shape.users and all(len(row) == shape.turns for row in plan)
    assert all(row[0] is not None for row in plan)  # every first turn attaches an image
    later = sum(key is not None for row in plan for key in row[1:])
    assert later == round(shape.users * (shape.turns - 1) * shape.later_image)
    images = [key for row in plan for key in row if key is not None]
    uploads = [key for key in images if key.startswith("U")]
    assert len(uploads) == round(len(images) * shape.upload_share)
    assert len(set(uploads)) == len(uploads)  # each upload is unique
    library = [key for key in images if key.startswith("L")]
    assert all(0 <= int(key[1:]) < shape.library for key in library)
    for row in plan:  # no conversation attaches one library image twice
        held = [key for key in row if key is not None]
        assert len(set(held)) == len(held)


def test_plan_is_the_same_for_a_seed_and_differs_across_seeds():
    shape = WorkloadShape(users=8, turns=4, library=6, upload_share=0.3, later_image=0.1)
    assert build_plan(shape, 3) == build_plan(shape, 3)
    assert build_plan(shape, 3) != build_plan(shape, 4)


@pytest.mark.parametrize("seed", range(5))
def test_arrival_gaps_average_the_stated_rate(seed):
    gaps = arrival_gaps(8, 0.05, seed)
    assert len(gaps) == 7 and all(gap > 0 for gap in gaps)
    assert math.isclose(sum(gaps), 7 / 0.05)


def test_arrival_gaps_for_sequential_runs_or_one_user_are_empty():
    assert arrival_gaps(8, 0, 0) == []
    assert arrival_gaps(1, 0.05, 0) == []


def test_users_word_the_same_turn_differently():
    assert len({question(user, 0) for user in range(12)}) == 12


def turn(user, index, image, sent_s):
    return TurnResult(user, index, 1.0, 1.0, 1, 1, 0, True, sent_s=sent_s, image=image)


def test_new_and_repeated_images_by_what_the_platform_was_sent_before():
    turns = [
        turn(0, 0, "L0", 0.0),
        turn(1, 0, "U1.0", 1.0),
        turn(0, 1, None, 2.0),
        turn(2, 0, "L1", 3.0),
        turn(3, 0, "U1.0", 4.0),  # the same upload again (not in a real plan): seen
    ]
    repeated, new = turns_by_image_novelty(turns, warmed=True)
    assert [t.image for t in repeated] == ["L0", "L1", "U1.0"]
    assert [t.image for t in new] == ["U1.0"]
    # On a cold platform the first sending of each library image is new as well.
    repeated, new = turns_by_image_novelty(turns, warmed=False)
    assert [t.image for t in new] == ["L0", "U1.0", "L1"]
    assert [t.image for t in repeated] == ["U1.0"]


def test_turns_go_round_robin_over_the_gateways():
    urls = ["g0", "g1", "g2"]
    # One user's turns reach every gateway in turn; users start on different ones.
    assert [gateway_for(urls, 0, turn) for turn in range(4)] == ["g0", "g1", "g2", "g0"]
    assert [gateway_for(urls, user, 0) for user in range(3)] == ["g0", "g1", "g2"]
    assert {gateway_for(["only"], user, turn) for user in range(3) for turn in range(3)} == {"only"}
