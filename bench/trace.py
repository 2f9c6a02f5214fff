"""Workload traces: the shape of a chat workload as JSONL, one line per turn, so that a user
can replay their traffic's shape against Iris without their data (`bench/workload.py
--trace FILE`), and write one (`--make-trace FILE`). The workload benchmark's built-in
image chat is one such trace (`plan_trace`).

One line, one turn (keys beyond these are refused, so a typo is not silently ignored):

    {"t": 12.5, "conversation": "c7", "turn": 0, "system": "You are ...",
     "text": "What is in this picture?", "images": [{"id": "L3", "width": 384,
     "height": 288}], "max_tokens": 8}

- `conversation` (string or integer) and `turn` (0, 1, ...: a conversation's turns are
  numbered from 0 without gaps, in any line order): every turn resends the conversation's
  history, the images and the answers to earlier turns included, as chat clients do.
- `t`: seconds from the start of the replay at which the turn is sent, but never before
  the answer to the conversation's previous turn has arrived; left out (or null) on a
  later turn: sent as soon as that answer arrives. A first turn needs it.
- `text`, or `tokens`: the user's words, or their length in the model's tokens (the
  replay writes that many tokens of filler text with the model's tokenizer).
- `images` (optional): each by `id` with `width` and `height` (pixels; 384 x 288 if left
  out): a synthetic picture drawn from the id, so the same id is the same picture and
  reuse shows where the user's traffic repeats an image; or by `path`, a file read as it
  is (relative to the trace's folder). Images come before the text in the message.
- `max_tokens` (default 8), and `system`: the system prompt, on a first turn only.
- `warm_up: true`: sent before the measured turns, one conversation after another, and
  not measured (what a running deployment has already seen).
"""

from __future__ import annotations

import io
import json
import random
from dataclasses import dataclass, field
from pathlib import Path

DEFAULT_WIDTH, DEFAULT_HEIGHT = 384, 288
_KEYS = {"t", "conversation", "turn", "text", "tokens", "images", "max_tokens", "system", "warm_up"}
_IMAGE_KEYS = {"id", "width", "height", "path"}


class TraceError(ValueError):
    """A trace line that cannot be replayed (the message names the line and the field)."""


@dataclass(frozen=True)
class TraceImage:
    """One attached image: synthetic by `id` at `width` x `height`, or the file at `path`."""

    id: str | None = None
    width: int = DEFAULT_WIDTH
    height: int = DEFAULT_HEIGHT
    path: str | None = None

    @property
    def key(self) -> str:
        """What names the image in results and in the replay's image table."""
        return self.id if self.id is not None else f"path:{self.path}"


@dataclass(frozen=True)
class TraceTurn:
    conversation: str
    turn: int
    t: float | None = None
    text: str | None = None
    tokens: int | None = None
    images: tuple[TraceImage, ...] = ()
    max_tokens: int = 8
    system: str | None = None
    warm_up: bool = False


@dataclass
class Conversation:
    """A conversation's turns in order; `start_s` is its first turn's `t`."""

    name: str
    turns: list[TraceTurn] = field(default_factory=list)

    @property
    def start_s(self) -> float:
        return self.turns[0].t or 0.0


# --- reading and writing ---------------------------------------------------------------


def _image(raw, where: str) -> TraceImage:
    if not isinstance(raw, dict) or set(raw) - _IMAGE_KEYS:
        raise TraceError(f"{where}: an image is an object with keys {sorted(_IMAGE_KEYS)}")
    if ("id" in raw) == ("path" in raw):
        raise TraceError(f"{where}: an image needs exactly one of id or path, got {raw}")
    width, height = raw.get("width", DEFAULT_WIDTH), raw.get("height", DEFAULT_HEIGHT)
    for name, value in (("width", width), ("height", height)):
        if not isinstance(value, int) or not 16 <= value <= 8192:
            raise TraceError(f"{where}: image {name} must be an integer in [16, 8192], got {value}")
    image_id = raw.get("id")
    return TraceImage(None if image_id is None else str(image_id), width, height, raw.get("path"))


def parse_line(line: str, number: int) -> TraceTurn:
    """One JSONL line → a TraceTurn; TraceError (naming line `number`) if it is not one."""
    where = f"trace line {number}"
    try:
        raw = json.loads(line)
    except json.JSONDecodeError as err:
        raise TraceError(f"{where}: not JSON ({err})") from None
    if not isinstance(raw, dict):
        raise TraceError(f"{where}: expected an object, got {type(raw).__name__}")
    unknown = set(raw) - _KEYS
    if unknown:
        raise TraceError(f"{where}: unknown keys {sorted(unknown)}; known: {sorted(_KEYS)}")
    for name in ("conversation", "turn"):
        if name not in raw:
            raise TraceError(f"{where}: {name} is required")
    turn = raw["turn"]
    if not isinstance(turn, int) or turn < 0:
        raise TraceError(f"{where}: turn must be an integer >= 0, got {turn!r}")
    if ("text" in raw) == ("tokens" in raw):
        raise TraceError(f"{where}: give exactly one of text or tokens")
    tokens = raw.get("tokens")
    if tokens is not None and (not isinstance(tokens, int) or tokens < 1):
        raise TraceError(f"{where}: tokens must be an integer >= 1, got {tokens!r}")
    t = raw.get("t")
    if t is not None and (not isinstance(t, (int, float)) or t < 0):
        raise TraceError(f"{where}: t must be a number of seconds >= 0, got {t!r}")
    max_tokens = raw.get("max_tokens", 8)
    if not isinstance(max_tokens, int) or max_tokens < 1:
        raise TraceError(f"{where}: max_tokens must be an integer >= 1, got {max_tokens!r}")
    images = raw.get("images", [])
    if not isinstance(images, list):
        raise TraceError(f"{where}: images must be a list")
    return TraceTurn(
        conversation=str(raw["conversation"]),
        turn=turn,
        t=None if t is None else float(t),
        text=raw.get("text"),
        tokens=tokens,
        images=tuple(_image(image, where) for image in images),
        max_tokens=max_tokens,
        system=raw.get("system"),
        warm_up=bool(raw.get("warm_up", False)),
    )


def read_trace(path: Path) -> list[TraceTurn]:
    """Every turn of the JSONL trace at `path` (blank lines skipped), checked whole."""
    turns = [
        parse_line(line, number)
        for number, line in enumerate(Path(path).read_text().splitlines(), 1)
        if line.strip()
    ]
    conversations(turns)  # numbering, first-turn times and system prompts
    return turns


def turn_record(turn: TraceTurn) -> dict:
    """A turn as its JSONL object, defaults left out."""
    record: dict = {"conversation": turn.conversation, "turn": turn.turn}
    if turn.t is not None:
        record["t"] = round(turn.t, 6)
    if turn.system is not None:
        record["system"] = turn.system
    if turn.text is not None:
        record["text"] = turn.text
    else:
        record["tokens"] = turn.tokens
    if turn.images:
        record["images"] = [
            {"path": image.path}
            if image.path is not None
            else {"id": image.id, "width": image.width, "height": image.height}
            for image in turn.images
        ]
    if turn.max_tokens != 8:
        record["max_tokens"] = turn.max_tokens
    if turn.warm_up:
        record["warm_up"] = True
    return record


def write_trace(path: Path, turns: list[TraceTurn]) -> None:
    """`turns` as JSONL at `path`, one line each, in the order given."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(turn_record(turn)) + "\n" for turn in turns))


def conversations(turns: list[TraceTurn]) -> list[Conversation]:
    """The turns grouped by conversation (in order of first appearance), each in turn
    order; TraceError when a conversation's turns are not 0..n-1, its first turn has no
    `t` (measured ones), or a later turn carries a system prompt or a warm-up flag of its
    own."""
    grouped: dict[str, Conversation] = {}
    for turn in turns:
        grouped.setdefault(turn.conversation, Conversation(turn.conversation)).turns.append(turn)
    for conversation in grouped.values():
        conversation.turns.sort(key=lambda turn: turn.turn)
        numbers = [turn.turn for turn in conversation.turns]
        if numbers != list(range(len(numbers))):
            raise TraceError(
                f"conversation {conversation.name!r}: turns must be 0..{len(numbers) - 1} once "
                f"each, got {numbers}"
            )
        first = conversation.turns[0]
        if first.t is None and not first.warm_up:
            raise TraceError(f"conversation {conversation.name!r}: its first turn needs t")
        for later in conversation.turns[1:]:
            if later.system is not None or later.warm_up != first.warm_up:
                raise TraceError(
                    f"conversation {conversation.name!r} turn {later.turn}: system and warm_up "
                    "belong to the first turn"
                )
    return list(grouped.values())


# --- images and filler text -------------------------------------------------------------


def synthetic_png(seed: str, width: int = DEFAULT_WIDTH, height: int = DEFAULT_HEIGHT) -> bytes:
    """A PNG drawn from `seed` alone: a background and six discs of seeded colours."""
    from PIL import Image, ImageDraw

    rng = random.Random(seed)
    image = Image.new("RGB", (width, height), tuple(rng.randrange(256) for _ in range(3)))
    draw = ImageDraw.Draw(image)
    # At 384 x 288 these are the workload benchmark's own pictures (discs of 80 px).
    disc = max(8, round(min(width, height) * 80 / 288))
    for _ in range(6):
        x, y = rng.randrange(max(width - 84, 1)), rng.randrange(max(height - 88, 1))
        draw.ellipse((x, y, x + disc, y + disc), fill=tuple(rng.randrange(256) for _ in range(3)))
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return buffer.getvalue()


def image_table(turns: list[TraceTurn], base: Path) -> dict[str, bytes]:
    """The bytes of every image the turns attach, by key (one entry per distinct image)."""
    table: dict[str, bytes] = {}
    for turn in turns:
        for image in turn.images:
            if image.key in table:
                continue
            if image.path is not None:
                table[image.key] = (Path(base) / image.path).read_bytes()
            else:
                table[image.key] = synthetic_png(image.id, image.width, image.height)
    return table


FILLER = (
    "the garden light falls on a quiet street where children play and the old house "
    "stands beside a river under a wide sky of summer clouds"
)


def filler_text(tokens: int, tokenizer) -> str:
    """Text of `tokens` tokens of `tokenizer`: plain words, cut to that many tokens (about
    that many in the prompt, where the chat template's text meets it)."""
    words = FILLER.split()
    words = (words * (tokens // len(words) + 2))[: tokens * 2 + 4]
    ids = tokenizer.encode(" ".join(words), add_special_tokens=False)[:tokens]
    return tokenizer.decode(ids)
