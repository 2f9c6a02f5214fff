"""Workload traces (bench/trace.py) and the workload benchmark's `--make-trace` / `--trace`
(bench/workload.py): a trace written is the trace read back, the built-in workload is one
(its counts, arrivals, warm-up and pictures), and a bad line is refused with its number."""

import json
import math
import subprocess
import sys
from argparse import Namespace
from dataclasses import replace
from pathlib import Path

import pytest

from bench.trace import (
    TraceError,
    TraceImage,
    TraceTurn,
    conversations,
    filler_text,
    image_table,
    parse_line,
    read_trace,
    synthetic_png,
    write_trace,
)
from bench.workload import (
    DEFAULT_SHAPE,
    SYSTEM_PROMPT,
    WorkloadShape,
    arrival_gaps,
    build_plan,
    builtin_trace,
    make_image,
    question,
)

ROOT = Path(__file__).resolve().parents[2]


def builtin_args(**overrides) -> Namespace:
    values = dict(rate=0.05, max_tokens=8, library=6, warm_up=True, size=(384, 288))
    return Namespace(**{**values, **overrides})


def test_a_written_trace_reads_back_the_same(tmp_path):
    turns = [
        TraceTurn("c0", 0, t=0.0, text="hello", system="be brief", max_tokens=4),
        TraceTurn("c0", 1, text="and?", images=(TraceImage("cat", 64, 48),)),
        TraceTurn("c1", 0, t=2.5, tokens=40, images=(TraceImage(path="a.png"),)),
        TraceTurn("w", 0, text="seen", images=(TraceImage("cat", 64, 48),), warm_up=True),
    ]
    path = tmp_path / "trace.jsonl"
    write_trace(path, turns)
    assert read_trace(path) == turns
    first = json.loads(path.read_text().splitlines()[0])
    assert first == {
        "conversation": "c0", "turn": 0, "t": 0.0, "system": "be brief", "text": "hello",
        "max_tokens": 4,
    }  # fmt: skip


def test_the_builtin_workload_is_a_trace_with_its_counts_arrivals_and_warm_up():
    args = builtin_args()
    trace = builtin_trace(args, DEFAULT_SHAPE, seed=3)
    plan = build_plan(DEFAULT_SHAPE, 3)
    groups = conversations(trace)
    warm = [c for c in groups if c.turns[0].warm_up]
    measured = [c for c in groups if not c.turns[0].warm_up]
    assert [c.turns[0].images[0].id for c in warm] == [f"L{i}" for i in range(6)]
    assert len(measured) == DEFAULT_SHAPE.users
    gaps = arrival_gaps(DEFAULT_SHAPE.users, args.rate, 3)
    for user, (conversation, row) in enumerate(zip(measured, plan, strict=True)):
        assert conversation.turns[0].system == SYSTEM_PROMPT
        assert math.isclose(conversation.turns[0].t, sum(gaps[:user]))
        assert all(turn.t is None for turn in conversation.turns[1:])  # after the answer
        for turn, key in zip(conversation.turns, row, strict=True):
            assert turn.text == question(user, turn.turn) and turn.max_tokens == 8
            ids = [image.id for image in turn.images]
            # A library image keeps its key; an upload is named by its seed and key.
            assert ids == ([] if key is None else [key if key[0] == "L" else f"3/{key}"])


def test_the_builtin_traces_pictures_are_the_workloads_own():
    trace = builtin_trace(builtin_args(), DEFAULT_SHAPE, seed=1)
    table = image_table(trace, ROOT)
    upload = next(key for key in table if "/U" in key)
    assert table["L2"] == make_image("L2", 1)
    assert table[upload] == make_image(upload.split("/", 1)[1], 1)


def test_make_trace_writes_the_builtin_workload(tmp_path):
    path = tmp_path / "made.jsonl"
    command = [
        sys.executable, str(ROOT / "bench" / "workload.py"), "--make-trace", str(path),
        "--users", "3", "--turns", "2", "--library", "2", "--reuse-share", "1",
        "--rate", "0.5", "--max-tokens", "5", "--image-size", "64x48", "--no-warm-up",
    ]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    turns = read_trace(path)
    shape = WorkloadShape(3, 2, 2, upload_share=0.0, later_image=0.1)
    expected = builtin_trace(
        builtin_args(rate=0.5, max_tokens=5, library=2, warm_up=False, size=(64, 48)), shape, 0
    )
    # Times are written to the microsecond.
    assert turns == [replace(t, t=None if t.t is None else round(t.t, 6)) for t in expected]
    assert not any(turn.warm_up for turn in turns)
    images = [image for turn in turns for image in turn.images]
    assert images and all(image.id.startswith("L") for image in images)  # reuse share 1
    assert {(image.width, image.height) for image in images} == {(64, 48)}


def test_images_by_id_are_drawn_from_the_id_and_by_path_read(tmp_path):
    (tmp_path / "photo.png").write_bytes(b"not decoded here")
    turns = [
        TraceTurn("c", 0, t=0, text="x", images=(TraceImage("a", 32, 32),)),
        TraceTurn("c", 1, text="y", images=(TraceImage("a", 32, 32), TraceImage(path="photo.png"))),
    ]
    table = image_table(turns, tmp_path)
    assert table == {"a": synthetic_png("a", 32, 32), "path:photo.png": b"not decoded here"}
    assert synthetic_png("a", 32, 32) != synthetic_png("b", 32, 32)


class WordTokenizer:
    """One token a word: enough to check the cut."""

    def encode(self, text, add_special_tokens=False):
        return text.split()

    def decode(self, ids):
        return " ".join(ids)


def test_filler_text_has_the_tokens_asked_for():
    for tokens in (1, 7, 120):
        assert len(filler_text(tokens, WordTokenizer()).split()) == tokens


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("not json", "not JSON"),
        ('{"conversation": "c", "turn": 0, "t": 0}', "exactly one of text or tokens"),
        ('{"conversation": "c", "turn": 0, "t": 0, "text": "x", "tokns": 3}', "unknown keys"),
        ('{"conversation": "c", "turn": -1, "t": 0, "text": "x"}', "turn must be"),
        ('{"conversation": "c", "turn": 0, "t": -2, "text": "x"}', "t must be"),
        ('{"conversation": "c", "turn": 0, "t": 0, "tokens": 0}', "tokens must be"),
        ('{"conversation": "c", "turn": 0, "t": 0, "text": "x", "images": [{}]}', "exactly one"),
        (
            '{"conversation": "c", "turn": 0, "t": 0, "text": "x", "images": [{"width": 3}]}',
            "one of",
        ),
        (
            '{"conversation": 1, "turn": 0, "t": 0, "text": "", "images": [{"id": 1, "width": 3}]}',
            "width",
        ),
    ],
)
def test_a_bad_line_is_refused_with_its_number(line, message):
    with pytest.raises(TraceError, match=message) as raised:
        parse_line(line, 7)
    assert "line 7" in str(raised.value)


def test_conversations_must_number_their_turns_and_time_their_first(tmp_path):
    with pytest.raises(TraceError, match=r"turns must be 0..1"):
        conversations([TraceTurn("c", 0, t=0, text="a"), TraceTurn("c", 2, text="b")])
    with pytest.raises(TraceError, match="first turn needs t"):
        conversations([TraceTurn("c", 0, text="a")])
    with pytest.raises(TraceError, match="belong to the first turn"):
        conversations([TraceTurn("c", 0, t=0, text="a"), TraceTurn("c", 1, text="b", system="s")])
    # Line order does not matter; turn order does.
    grouped = conversations([TraceTurn("c", 1, text="b"), TraceTurn("c", 0, t=1, text="a")])
    assert [turn.text for turn in grouped[0].turns] == ["a", "b"]
