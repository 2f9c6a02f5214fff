"""Tool calls out of a model's answer, in the family's format (iris.models.tool_format),
whole or as a stream: `ToolCallStream.feed(text)` returns OpenAI deltas — `{"content"}`
for text outside calls (holding back what could still open a call) and `{"tool_calls"}`
for each call once its closing tag arrives. A block that is not a valid call (bad JSON, an
unknown function) stays content. Both paths run this one parser, so they agree.

A Qwen XML body (`<function=NAME>` + `<parameter=P>` blocks) gives each argument as the
text written when the tool's schema declares it a string, else as the JSON it holds (the
text itself when it is not JSON)."""

from __future__ import annotations

import json
import re
import uuid

from iris.models.tool_format import ToolCallFormat, parsed_arguments


def new_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


_XML_FUNCTION = re.compile(r"\s*<function=([^>\n]+)>(.*)</function>\s*", re.DOTALL)
_XML_PARAMETER = re.compile(r"\s*<parameter=([^>\n]+)>\n?(.*?)\n?</parameter>", re.DOTALL)


class ToolCallStream:
    def __init__(
        self, fmt: ToolCallFormat, names: set[str], parameters: dict[str, dict] | None = None
    ) -> None:
        """`names`: the functions a call may name; `parameters`: their parameter schemas
        (read by the Qwen XML style, to know which arguments are strings)."""
        self.open_tag = fmt.call_begin.strip()
        self.close_tag = fmt.call_end.strip()
        self.style = fmt.style
        self.names = names
        self.parameters = parameters or {}
        self.calls: list[dict] = []  # every call parsed so far (OpenAI shape, with index)
        self._buffer = ""
        self._inside = False
        self._after_call = False  # blanks right after a call are separators, not content

    def feed(self, text: str) -> list[dict]:
        self._buffer += text
        deltas: list[dict] = []
        while True:
            if self._inside:
                end = self._buffer.find(self.close_tag)
                if end < 0:
                    return deltas
                body, self._buffer = self._buffer[:end], self._buffer[end + len(self.close_tag) :]
                self._inside = False
                call = self._call(body)
                if call is None:
                    deltas.append({"content": f"{self.open_tag}{body}{self.close_tag}"})
                else:
                    deltas.append({"tool_calls": [call]})
                    self._after_call = True
                continue
            if self._after_call:
                self._buffer = self._buffer.lstrip()
                if not self._buffer:
                    return deltas
                self._after_call = False
            start = self._buffer.find(self.open_tag)
            if start >= 0:
                before = self._buffer[:start].rstrip()
                if before:
                    deltas.append({"content": before})
                self._buffer = self._buffer[start + len(self.open_tag) :]
                self._inside = True
                continue
            keep = _partial_suffix(self._buffer, self.open_tag)
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
        rest = (self.open_tag if self._inside else "") + self._buffer
        self._buffer, self._inside = "", False
        if self._after_call:
            rest = rest.lstrip()
        return [{"content": rest}] if rest.strip() or (rest and not self.calls) else []

    def _call(self, body: str) -> dict | None:
        parsed = self._xml_body(body) if self.style == "qwen_xml" else _json_body(body)
        if parsed is None:
            return None
        name, arguments = parsed
        if name not in self.names or not isinstance(arguments, dict):
            return None
        call = {
            "index": len(self.calls),
            "id": new_call_id(),
            "type": "function",
            "function": {"name": name, "arguments": json.dumps(arguments, ensure_ascii=False)},
        }
        self.calls.append(call)
        return call

    def _xml_body(self, body: str) -> tuple[str, dict] | None:
        function = _XML_FUNCTION.fullmatch(body)
        if function is None:
            return None
        name, inner = function.group(1), function.group(2)
        properties = (self.parameters.get(name) or {}).get("properties") or {}
        arguments, cursor = {}, 0
        for parameter in _XML_PARAMETER.finditer(inner):
            if parameter.start() != cursor:
                return None  # text between parameters: not a call
            key, text = parameter.group(1), parameter.group(2)
            declared = properties.get(key) if isinstance(properties, dict) else None
            arguments[key] = text if _is_string(declared) else parsed_arguments(text)
            cursor = parameter.end()
        if inner[cursor:].strip():
            return None
        return name, arguments


def _json_body(body: str) -> tuple[object, object] | None:
    try:
        parsed = json.loads(body)
    except (ValueError, RecursionError):  # a model may write JSON nested past the stack
        return None
    if not isinstance(parsed, dict):
        return None
    return parsed.get("name"), parsed.get("arguments", {})


def _is_string(schema) -> bool:
    """Whether a parameter's schema declares a string (then its text is the value)."""
    return isinstance(schema, dict) and schema.get("type") == "string"


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
    stream = ToolCallStream(fmt, names, parameters)
    deltas = stream.feed(text) + stream.close()
    content = "".join(delta.get("content", "") for delta in deltas)
    calls = [{key: value for key, value in call.items() if key != "index"} for call in stream.calls]
    return (content or None) if calls else content, calls
