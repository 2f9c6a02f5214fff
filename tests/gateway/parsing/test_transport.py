"""The packed trip of a parsed body back from a parse worker (gateway/parsing/transport.py):
what is unpacked equals what was packed, whatever its shape, and a heavy container travels
as pieces of bounded weight."""

from __future__ import annotations

import json
import pickle
import struct

import pytest

from gateway.api.schemas import ChatCompletionRequest, CompletionRequest
from gateway.parsing import transport
from gateway.parsing.transport import pack, unpack
from gateway.parsing.worker import parse_body


def _round_trip(value):
    back = unpack(pack(value))
    assert back == value
    assert type(back) is type(value)
    return back


def test_plain_data_of_every_shape_comes_back_equal():
    nested = {
        "a": [{"k": i, "v": [i] * 3} for i in range(3000)],
        "b": {str(i): i for i in range(9000)},
    }
    _round_trip(nested)
    _round_trip([[1, 2]] * 5000)
    _round_trip(list(range(100_000)))  # int64 bytes
    mixed = [*range(5000), True, 2**70, -(2**63)]  # a bool, an int past int64: not as bytes
    back = _round_trip(mixed)
    assert back[5000] is True
    _round_trip(["x" * 10, 1.5, None, False] * 3000)


def test_long_texts_come_back_whole_across_their_slices(monkeypatch):
    monkeypatch.setattr(transport, "TEXT_SLICE", 7)  # cuts fall inside multi-byte characters
    for text in ("é" * 50, "a€😀" * 40, "x" + "\ud800" * 20 + "y" * 9, "plain ascii " * 9):
        assert _round_trip({"t": text})["t"] == text


def _frame_sizes(data: bytes) -> list[int]:
    (count,) = struct.unpack_from("<Q", data)
    return list(struct.unpack_from(f"<{count}Q", data, 8))


def test_a_heavy_container_travels_as_bounded_pieces(monkeypatch):
    monkeypatch.setattr(transport, "STRETCH", 64)
    value = {"bias": {str(i): i for i in range(5000)}, "rows": [{"x": "y" * 3}] * 4000}
    packed = pack(value)
    assert unpack(packed) == value
    sizes = _frame_sizes(packed)
    assert len(sizes) > 100  # cut into many pieces
    assert max(sizes) < 64 * 40  # each piece a few dozen values


def test_no_frame_holds_a_long_text_whole_wherever_it_sits(monkeypatch):
    """A long string inside a cut container travels as slices in frames of their own, not
    inside its piece's frame (which the gateway would copy out whole)."""
    monkeypatch.setattr(transport, "TEXT_SLICE", 1000)
    text = "abcdefgh" * 5000  # 40,000 characters
    value = {"messages": [{"content": text}, {"content": "short"}] * 3, "n": 1}
    packed = pack(value)
    assert unpack(packed) == value
    assert max(_frame_sizes(packed)) < 4000


def test_a_packed_value_is_read_back_from_shared_memory_and_the_segment_removed():
    from multiprocessing.shared_memory import SharedMemory

    value = {"ids": list(range(50_000)), "text": "é" * 2_000_000}
    packed = pack(value)
    segment = SharedMemory(create=True, size=len(packed))
    segment.buf[: len(packed)] = packed
    name = segment.name
    segment.close()
    assert transport.unpack_shared(name, len(packed)) == value
    with pytest.raises(FileNotFoundError):
        SharedMemory(name=name)


def test_models_come_back_equal_to_the_in_process_parse():
    chat = {
        "model": "m",
        "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}] * 3}] * 3000,
        "logit_bias": {str(i): 1 for i in range(5000)},
        "tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}] * 40,
        "metadata": {"kept": "as an extra"},
    }
    for model, body in (
        (ChatCompletionRequest, chat),
        (CompletionRequest, {"model": "m", "prompt": list(range(200_000))}),
        (CompletionRequest, {"model": "m", "prompt": ["é" * 3_000_000, "b"]}),
    ):
        raw = json.dumps(body).encode()
        kind, value = unpack(parse_body(model, raw))
        assert kind == "model"
        assert value == model.model_validate(json.loads(raw))
        assert value.model_extra == model.model_validate(json.loads(raw)).model_extra


def test_only_a_parsed_bodys_classes_are_unpacked():
    class Evil:
        def __reduce__(self):
            return (print, ("never",))

    with pytest.raises(pickle.UnpicklingError, match="not part of a parsed body"):
        data = pickle.dumps(Evil())
        unpack(struct.pack("<2Q", 1, len(data)) + data)
