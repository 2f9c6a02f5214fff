"""A parsed body carried from a worker process to the gateway's, such that taking it back
holds the GIL only in short stretches.

`pack` pickles a value, but every list or dict heavier than `STRETCH` (its items, counted
through nested containers and models) is cut into pieces of at most that weight, each
pickled apart; a list of integers travels as int64 bytes, a long string as UTF-8 slices.
`unpack` unpickles piece by piece, rejoining them in Python between the pieces: each piece
is one C call of bounded length, and between them the interpreter may hand the GIL to the
event loop (run `unpack` on a worker thread). One `pickle.loads` of the whole would hold
the GIL for as long as the body is large: 120k dict entries take ~20 ms.
"""

from __future__ import annotations

import io
import pickle
import sys
from array import array
from collections.abc import Callable, Iterable

from pydantic import BaseModel

STRETCH = 2048  # weight per piece: about 0.1-0.5 ms to unpickle
INT_SLICE = 8192  # int64 values turned into Python ints per C call
TEXT_SLICE = 1 << 20  # bytes of UTF-8 decoded per C call (a long string travels as these)
# The classes a parsed body may hold: the request models (gateway.api.schemas) and what
# pydantic pickles with them.
_ALLOWED_MODULES = ("gateway.api.", "pydantic.", "pydantic_core.")


def pack(value: object) -> bytes:
    """`value` (plain data and pydantic models) as bytes for `unpack`."""
    limit = sys.getrecursionlimit()
    # Nesting the JSON parser accepted (its own limit) must pickle: a frame or two per level.
    sys.setrecursionlimit(max(limit, 10_000))
    try:
        return _dumps(value, _Weights())
    finally:
        sys.setrecursionlimit(limit)


def unpack(data: bytes) -> object:
    """The value `pack` packed. Trusted input only: what this gateway's own worker packed."""
    return _Unpacker(io.BytesIO(data)).load()


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


def _dumps(value: object, weights: _Weights) -> bytes:
    out = io.BytesIO()
    _Packer(out, weights, value).dump(value)
    return out.getvalue()


class _Packer(pickle.Pickler):
    def __init__(self, file, weights: _Weights, top: object) -> None:
        super().__init__(file, protocol=5)
        self.weights = weights
        self.top = top  # the piece being pickled: never cut again

    def persistent_id(self, obj):
        kind = type(obj)
        if kind is str and len(obj) > TEXT_SLICE:
            return ("text", _utf8_slices(obj))
        if (kind is not list and kind is not dict) or obj is self.top:
            return None
        if self.weights.of(obj) <= STRETCH:
            return None
        if kind is list:
            ids = _int64_bytes(obj)
            if ids is not None:
                return ("ints", ids)
            pieces = _pieces(obj, self.weights.of)
            return ("list", tuple(_dumps(piece, self.weights) for piece in pieces))
        pieces = _pieces(obj.items(), lambda kv: self.weights.of(kv[0]) + self.weights.of(kv[1]))
        return ("dict", tuple(_dumps(dict(piece), self.weights) for piece in pieces))


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
    def find_class(self, module: str, name: str):
        # Only what a parsed body holds: never a callable such as builtins.eval.
        if module.startswith(_ALLOWED_MODULES):
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"{module}.{name} is not part of a parsed body")

    def persistent_load(self, pid):
        kind, payload = pid
        if kind == "ints":
            values = array("q")
            values.frombytes(payload)
            ints: list[int] = []
            for start in range(0, len(values), INT_SLICE):
                ints += values[start : start + INT_SLICE].tolist()
            return ints
        if kind == "text":
            return "".join([piece.decode("utf-8", "surrogatepass") for piece in payload])
        if kind == "list":
            items: list = []
            for piece in payload:
                items += unpack(piece)
            return items
        if kind == "dict":
            mapping: dict = {}
            for piece in payload:
                mapping.update(unpack(piece))
            return mapping
        raise pickle.UnpicklingError(f"unknown piece kind {kind!r}")
