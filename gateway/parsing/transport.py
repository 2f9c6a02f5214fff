"""A parsed body carried from a worker process to the gateway's, such that taking it back
holds the GIL only in short stretches.

`pack` pickles a value into frames: every list or dict heavier than `STRETCH` (its items,
counted through nested containers and models; a string weighs one per 512 characters) is
cut into pieces of at most that weight, each pickled into a frame of its own; a list of
integers travels as one frame of int64 bytes, a long string as frames of 1 MiB UTF-8
slices. Frames refer to each other by index, never nest, so none is larger than about
1 MiB plus `STRETCH` small values (an int frame: the value cap x 8 bytes). `unpack` reads
frame by frame, rejoining pieces in Python between them: each is one C call of bounded
length (and one bounded copy out of shared memory, `unpack_shared`), and between them the
interpreter may hand the GIL to the event loop (run it on a worker thread). One
`pickle.loads` of the whole would hold the GIL for as long as the body is large: 120k dict
entries take ~20 ms.
"""

from __future__ import annotations

import contextlib
import io
import pickle
import struct
import sys
from array import array
from collections.abc import Callable, Iterable
from multiprocessing.shared_memory import SharedMemory

from pydantic import BaseModel

STRETCH = 2048  # weight per piece: about 0.1-0.5 ms to unpickle
TEXT_WEIGHT_CHARS = 512  # characters of a string that weigh as one value: a piece <= ~1 MiB
INT_SLICE = 8192  # int64 values turned into Python ints per C call
TEXT_SLICE = 1 << 20  # bytes of UTF-8 decoded per C call (a long string travels as these)
# The classes a parsed body may hold: the request models (gateway.api.schemas) and what
# pydantic pickles with them.
_ALLOWED_MODULES = ("gateway.api.", "pydantic.", "pydantic_core.")


def pack(value: object) -> bytes:
    """`value` (plain data and pydantic models) as bytes for `unpack`: a count, the frames'
    lengths (8 bytes each), then the frames; frame 0 is the top."""
    limit = sys.getrecursionlimit()
    # Nesting the JSON parser accepted (its own limit) must pickle: a frame or two per level.
    sys.setrecursionlimit(max(limit, 10_000))
    try:
        frames: list[bytes] = [b""]
        frames[0] = _dumps(value, _Weights(), frames)
    finally:
        sys.setrecursionlimit(limit)
    table = struct.pack(f"<{len(frames) + 1}Q", len(frames), *map(len, frames))
    return b"".join([table, *frames])


def unpack(data: bytes) -> object:
    """The value `pack` packed. Trusted input only: what this gateway's own worker packed."""
    return _load(memoryview(data))


def unpack_shared(name: str, size: int) -> object:
    """The value a worker packed into shared-memory segment `name` (`size` bytes), read
    frame by frame in bounded copies (never the whole as one `bytes`); the segment is
    removed."""
    segment = SharedMemory(name=name)
    try:
        view = segment.buf[:size]
        try:
            return _load(view)
        finally:
            view.release()
    finally:
        segment.close()
        segment.unlink()


def remove_shared(name: str) -> None:
    """Remove a segment a worker left that nobody will read (its request is gone)."""
    with contextlib.suppress(FileNotFoundError):
        segment = SharedMemory(name=name)
        segment.close()
        segment.unlink()


class _Frames:
    """The frames of a packed value, over a memoryview: `frame(i)` copies out only frame i."""

    def __init__(self, view: memoryview) -> None:
        (count,) = struct.unpack_from("<Q", view, 0)
        lengths = struct.unpack_from(f"<{count}Q", view, 8)
        self.view = view
        self.starts = [8 * (count + 1)]
        for length in lengths:
            self.starts.append(self.starts[-1] + length)

    def frame(self, index: int) -> bytes:
        return bytes(self.view[self.starts[index] : self.starts[index + 1]])


def _load(view: memoryview) -> object:
    frames = _Frames(view)
    return _Unpacker(frames, 0).load()


class _Weights:
    """How many values a container holds, nested ones included (memoised; the objects are
    kept so that their ids stay theirs)."""

    def __init__(self) -> None:
        self._memo: dict[int, tuple[object, int]] = {}

    def of(self, obj: object) -> int:
        kind = type(obj)
        if kind is list or kind is tuple or kind is dict or isinstance(obj, BaseModel):
            known = self._memo.get(id(obj))
            if known is not None:
                return known[1]
            weight = 1 + sum(self.of(child) for child in _children(obj))
            self._memo[id(obj)] = (obj, weight)
            return weight
        if kind is str or kind is bytes:
            # Long strings weigh by their length, so that a piece's bytes are bounded too.
            return 1 + len(obj) // TEXT_WEIGHT_CHARS
        return 1


def _children(obj) -> Iterable:
    if isinstance(obj, dict):
        for key, value in obj.items():
            yield key
            yield value
    elif isinstance(obj, BaseModel):
        yield obj.__dict__
        yield obj.__pydantic_extra__ or {}
    else:
        yield from obj


def _dumps(value: object, weights: _Weights, frames: list[bytes]) -> bytes:
    out = io.BytesIO()
    _Packer(out, weights, value, frames).dump(value)
    return out.getvalue()


class _Packer(pickle.Pickler):
    def __init__(self, file, weights: _Weights, top: object, frames: list[bytes]) -> None:
        super().__init__(file, protocol=5)
        self.weights = weights
        self.top = top  # the piece being pickled: never cut again
        self.frames = frames

    def _framed(self, data: bytes) -> int:
        self.frames.append(data)
        return len(self.frames) - 1

    def persistent_id(self, obj):
        kind = type(obj)
        if kind is str and len(obj) > TEXT_SLICE:
            return ("text", tuple(map(self._framed, _utf8_slices(obj))))
        if (kind is not list and kind is not dict) or obj is self.top:
            return None
        if self.weights.of(obj) <= STRETCH:
            return None
        if kind is list:
            ids = _int64_bytes(obj)
            if ids is not None:
                return ("ints", self._framed(ids))
            pieces = _pieces(obj, self.weights.of)
            return ("list", tuple(self._piece(piece) for piece in pieces))
        pieces = _pieces(obj.items(), lambda kv: self.weights.of(kv[0]) + self.weights.of(kv[1]))
        return ("dict", tuple(self._piece(dict(piece)) for piece in pieces))

    def _piece(self, piece: object) -> int:
        index = self._framed(b"")  # its place, before the frames its own pieces take
        self.frames[index] = _dumps(piece, self.weights, self.frames)
        return index


def _utf8_slices(text: str) -> tuple[bytes, ...]:
    """`text` as UTF-8 in slices of about TEXT_SLICE bytes, each cut between characters."""
    data = text.encode("utf-8", "surrogatepass")  # JSON may carry a lone surrogate
    slices, start = [], 0
    while start < len(data):
        end = min(start + TEXT_SLICE, len(data))
        while end < len(data) and data[end] & 0xC0 == 0x80:  # a continuation byte
            end -= 1
        slices.append(data[start:end])
        start = end
    return tuple(slices)


def _int64_bytes(items: list) -> bytes | None:
    if not all(type(item) is int for item in items):  # not bool, not float
        return None
    try:
        return array("q", items).tobytes()
    except OverflowError:
        return None


def _pieces(items: Iterable, weigh: Callable[[object], int]) -> Iterable[list]:
    piece, total = [], 0
    for item in items:
        weight = weigh(item)
        if piece and total + weight > STRETCH:
            yield piece
            piece, total = [], 0
        piece.append(item)
        total += weight
    if piece:
        yield piece


class _Unpacker(pickle.Unpickler):
    def __init__(self, frames: _Frames, index: int) -> None:
        super().__init__(io.BytesIO(frames.frame(index)))
        self.frames = frames

    def find_class(self, module: str, name: str):
        # Only what a parsed body holds: never a callable such as builtins.eval.
        if module.startswith(_ALLOWED_MODULES):
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"{module}.{name} is not part of a parsed body")

    def persistent_load(self, pid):
        kind, payload = pid
        if kind == "ints":
            values = array("q")
            values.frombytes(self.frames.frame(payload))
            ints: list[int] = []
            for start in range(0, len(values), INT_SLICE):
                ints += values[start : start + INT_SLICE].tolist()
            return ints
        if kind == "text":
            return "".join([self.frames.frame(i).decode("utf-8", "surrogatepass") for i in payload])
        if kind == "list":
            items: list = []
            for index in payload:
                items += _Unpacker(self.frames, index).load()
            return items
        if kind == "dict":
            mapping: dict = {}
            for index in payload:
                mapping.update(_Unpacker(self.frames, index).load())
            return mapping
        raise pickle.UnpicklingError(f"unknown piece kind {kind!r}")
