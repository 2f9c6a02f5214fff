"""Tool calls out of a model's answer, in the family's format (iris.models.tool_format),
whole or as a stream: `tool_call_stream(fmt, names).feed(text)` returns OpenAI deltas —
`{"content"}` for text outside calls (holding back what could still open a call) and
`{"tool_calls"}` for each call once it is complete: a tagged call (Hermes) when its closing
tag arrives, a list format's calls (Mistral's `[TOOL_CALLS][...]`) when the list closes. A
block that is not a valid call (bad JSON, an unknown function) stays content. Both paths
run this one parser, so they agree.

A Qwen XML body (`<function=NAME>` + `<parameter=P>` blocks) gives each argument as bare
text, typed by the tool's schema as every text-format argument is
(gateway/api/argument_types.py: JSON only where the schema allows a non-string type and the
JSON validates; else the text)."""

from __future__ import annotations

import json
import re

from gateway.api.argument_types import argument_value
from iris.models.tool_format import ToolCallFormat

_XML_FUNCTION = re.compile(r"\s*<function=([^>\n]+)>(.*)</function>\s*", re.DOTALL)
_XML_PARAMETER = re.compile(r"\s*<parameter=([^>\n]+)>\n?(.*?)\n?</parameter>", re.DOTALL)


def tool_call_stream(
    fmt: ToolCallFormat, names: set[str], parameters: dict[str, dict] | None = None
) -> ToolCallStream | ListCallStream:
    """The parser for `fmt`'s calls to the functions `names` (`parameters`: their schemas,
    which the Qwen XML style reads to know which arguments are strings)."""
    if fmt.is_list:
        return ListCallStream(fmt, names)
    return ToolCallStream(fmt, names, parameters)


class _MarkedCallStream:
    """What both call formats share: text up to an opener is content (holding back what
    could still begin one), then a body whose end the format finds, parsed into calls or
    given back as content. A subclass sets `opener` and defines `_body_end` and `_parse`."""

    opener: str

    def __init__(self, fmt: ToolCallFormat, names: set[str]) -> None:
        self.fmt = fmt
        self.names = names
        self.calls: list[dict] = []  # every call parsed so far (OpenAI shape, with index)
        self._buffer = ""
        self._inside = False
        self._after_call = False  # blanks right after a call are separators, not content

    def feed(self, text: str) -> list[dict]:
        self._buffer += text
        deltas: list[dict] = []
        while True:
            if self._inside:
                ends = self._body_end(self._buffer)
                if ends is None:
                    return deltas
                body_end, resume = ends
                body, raw = self._buffer[:body_end], self._buffer[:resume]
                self._buffer = self._buffer[resume:]
                self._inside = False
                calls = self._parse(body)
                if calls is None:
                    deltas.append({"content": f"{self.opener}{raw}"})
                else:
                    deltas.extend({"tool_calls": [call]} for call in calls)
                    self._after_call = True
                continue
            if self._after_call:
                self._buffer = self._buffer.lstrip()
                if not self._buffer:
                    return deltas
                self._after_call = False
            start = self._buffer.find(self.opener)
            if start >= 0:
                before = self._buffer[:start].rstrip()
                if before:
                    deltas.append({"content": before})
                self._buffer = self._buffer[start + len(self.opener) :]
                self._inside = True
                continue
            keep = _partial_suffix(self._buffer, self.opener)
            # Trailing blanks are held too: they may only separate this text from a call.
            visible = self._buffer[: len(self._buffer) - keep]
            held = len(visible) - len(visible.rstrip())
            emit = visible[: len(visible) - held]
            self._buffer = self._buffer[len(emit) :]
            if emit:
                deltas.append({"content": emit})
            return deltas

    def close(self) -> list[dict]:
        """The end of the answer: what is still held is content (an unclosed call too)."""
        rest = (self.opener if self._inside else "") + self._buffer
        self._buffer, self._inside = "", False
        if self._after_call:
            rest = rest.lstrip()
        return [{"content": rest}] if rest.strip() or (rest and not self.calls) else []

    def _body_end(self, buffer: str) -> tuple[int, int] | None:
        """(end of the body, index just past its closing) in `buffer`, or None while open."""
        raise NotImplementedError

    def _parse(self, body: str) -> list[dict] | None:
        """The calls in a complete body (recorded in `self.calls`), or None if it is none."""
        raise NotImplementedError


class ToolCallStream(_MarkedCallStream):
    """Calls each wrapped in an opening and a closing tag (Hermes, Qwen XML)."""

    def __init__(
        self, fmt: ToolCallFormat, names: set[str], parameters: dict[str, dict] | None = None
    ) -> None:
        super().__init__(fmt, names)
        self.parameters = parameters or {}
        self.opener = self.open_tag = fmt.call_begin.strip()
        self.close_tag = fmt.call_end.strip()

    def _body_end(self, buffer: str) -> tuple[int, int] | None:
        end = buffer.find(self.close_tag)
        return None if end < 0 else (end, end + len(self.close_tag))

    def _parse(self, body: str) -> list[dict] | None:
        parsed = self._xml_body(body) if self.fmt.style == "qwen_xml" else _loads(body)
        if not _is_call(parsed, self.names):
            return None
        call = _openai_call(parsed, len(self.calls), self.fmt)
        self.calls.append(call)
        return [call]

    def _xml_body(self, body: str) -> dict | None:
        """`{"name", "arguments"}` of a Qwen XML call's body, or None if it is not one."""
        function = _XML_FUNCTION.fullmatch(body)
        if function is None:
            return None
        name, inner = function.group(1), function.group(2)
        root = self.parameters.get(name)
        root = root if isinstance(root, dict) else {}
        properties = root.get("properties")
        properties = properties if isinstance(properties, dict) else {}
        arguments, cursor = {}, 0
        for parameter in _XML_PARAMETER.finditer(inner):
            if parameter.start() != cursor:
                return None  # text between parameters: not a call
            key, text = parameter.group(1), parameter.group(2)
            arguments[key] = argument_value(text, properties.get(key), root)
            cursor = parameter.end()
        if inner[cursor:].strip():
            return None
        return {"name": name, "arguments": arguments}


class ListCallStream(_MarkedCallStream):
    """Calls as one JSON list after a marker, ending where the list closes (Mistral:
    `[TOOL_CALLS][{"name": ..., "arguments": {...}}, ...]`). The list is valid only whole:
    one bad entry leaves the marker and the list as content."""

    def __init__(self, fmt: ToolCallFormat, names: set[str]) -> None:
        super().__init__(fmt, names)
        self.opener = self.marker = fmt.marker
        self._scan = _JsonEnd()

    def _body_end(self, buffer: str) -> tuple[int, int] | None:
        end = self._scan.end_in(buffer)
        if end is None:
            return None
        self._scan = _JsonEnd()
        return end, end

    def _parse(self, body: str) -> list[dict] | None:
        parsed = _loads(body)
        entries = [parsed] if isinstance(parsed, dict) else parsed  # one call without a list
        if not isinstance(entries, list) or not entries:
            return None
        if not all(_is_call(entry, self.names) for entry in entries):
            return None
        calls = [
            _openai_call(entry, len(self.calls) + i, self.fmt) for i, entry in enumerate(entries)
        ]
        self.calls.extend(calls)
        return calls


class _JsonEnd:
    """Where the JSON value at the start of a growing text ends (after leading blanks),
    scanned incrementally: each character is looked at once however the text arrives."""

    def __init__(self) -> None:
        self._pos = 0
        self._depth = 0
        self._in_string = False
        self._escaped = False

    def end_in(self, text: str) -> int | None:
        """The index just past the value, or None while it is open. A value that does not
        open with `[` or `{` ends before its first character (it is no call list)."""
        for index in range(self._pos, len(text)):
            char = text[index]
            if self._in_string:
                if self._escaped:
                    self._escaped = False
                elif char == "\\":
                    self._escaped = True
                elif char == '"':
                    self._in_string = False
            elif self._depth == 0 and char.isspace():
                continue
            elif char in "[{":
                self._depth += 1
            elif self._depth == 0:
                return index
            elif char in "]}":
                self._depth -= 1
                if self._depth == 0:
                    return index + 1
            elif char == '"':
                self._in_string = True
        self._pos = len(text)
        return None


def _loads(body: str) -> object:
    try:
        return json.loads(body)
    except (ValueError, RecursionError):  # a model may write JSON nested past the stack
        return None


def _is_call(parsed: object, names: set[str]) -> bool:
    return (
        isinstance(parsed, dict)
        and parsed.get("name") in names
        and isinstance(parsed.get("arguments", {}), dict)
    )


def _openai_call(parsed: dict, index: int, fmt: ToolCallFormat) -> dict:
    arguments = json.dumps(parsed.get("arguments", {}), ensure_ascii=False)
    return {
        "index": index,
        "id": fmt.new_call_id(),
        "type": "function",
        "function": {"name": parsed["name"], "arguments": arguments},
    }


def _partial_suffix(text: str, tag: str) -> int:
    """Length of the longest end of `text` that is a start of `tag`."""
    for length in range(min(len(text), len(tag) - 1), 0, -1):
        if tag.startswith(text[-length:]):
            return length
    return 0


def parse_answer(
    text: str, fmt: ToolCallFormat, names: set[str], parameters: dict[str, dict] | None = None
) -> tuple[str | None, list[dict]]:
    """(content or None, tool calls without their stream index) of a whole answer."""
    stream = tool_call_stream(fmt, names, parameters)
    deltas = stream.feed(text) + stream.close()
    content = "".join(delta.get("content", "") for delta in deltas)
    calls = [{key: value for key, value in call.items() if key != "index"} for call in stream.calls]
    return (content or None) if calls else content, calls
