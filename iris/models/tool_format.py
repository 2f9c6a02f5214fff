"""How a model family writes tool calls, and how tools reach a prompt whose chat template
does not render them.

Hermes style (Qwen2 / Qwen2.5-VL, and Iris's default): each call is
`<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`. Mistral style (Mistral
Small 3.x): the `[TOOL_CALLS]` control token, then all calls as one JSON list
`[{"name": ..., "arguments": {...}}, ...]`, then the end of the answer. Qwen XML style
(Qwen3.5, Qwen3-Coder): `<tool_call>\\n<function=NAME>\\n<parameter=P>\\nVALUE\\n</parameter>
\\n...</function>\\n</tool_call>`, a string VALUE as it is, any other as JSON; an adapter
finds it in its chat template (`format_of_template`). A template that renders
`tools` itself gets them as they are; for one that does not, the adapter adds its own
system instruction listing the tools and showing that format, and turns earlier calls and
tool results into text the template can render.
"""

from __future__ import annotations

import json
import secrets
import string
import uuid
from collections.abc import Sequence
from dataclasses import dataclass

# Arguments nested deeper than this stay the string they came as: a template that walks a
# deeper object (tojson, loops) could exhaust the stack.
MAX_ARGUMENT_DEPTH = 64


def parsed_arguments(text: str) -> object:
    """A call's `arguments` string as the JSON value it holds, or the string itself when it
    is not JSON or nests deeper than MAX_ARGUMENT_DEPTH (never a RecursionError)."""
    if _bracket_depth(text) > MAX_ARGUMENT_DEPTH:
        return text
    try:
        return json.loads(text)
    except (ValueError, RecursionError):
        return text


def _bracket_depth(text: str) -> int:
    # An upper bound of the nesting (brackets inside strings count too): cheap, no parse.
    depth = deepest = 0
    for char in text:
        if char in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif char in "]}":
            depth -= 1
    return deepest


@dataclass(frozen=True)
class ToolCallFormat:
    """The text around one call's JSON (`{"name": ..., "arguments": ...}`), around the list
    of one answer's calls, and around a tool's result.

    `list_begin` non-empty makes a list format: the calls are one JSON list that opens with
    `list_begin` (whose last character is the list's `[`) and closes with `list_end`.
    `marker_is_control`: the opening marker is a control token, which the pod's detokenizer
    drops unless special tokens are kept (the gateway keeps them when it parses calls).
    `style` "qwen_xml": a call's body is `<function=NAME>` with one `<parameter=P>` block per
    argument (xgrammar's style of the same name) instead of the JSON object."""

    call_begin: str = "<tool_call>\n"
    call_end: str = "\n</tool_call>"
    result_begin: str = "<tool_response>\n"
    result_end: str = "\n</tool_response>"
    separator: str = "\n"  # between parallel calls
    style: str = "json"
    list_begin: str = ""
    list_end: str = ""
    marker_is_control: bool = False
    # Mistral's templates accept only ids of 9 letters and digits; OpenAI's are `call_…`.
    short_call_ids: bool = False

    @property
    def is_list(self) -> bool:
        return bool(self.list_begin)

    @property
    def marker(self) -> str:
        """What opens the calls in an answer (`[TOOL_CALLS]`, `<tool_call>`)."""
        if self.is_list:
            return self.list_begin[:-1].strip()
        return self.call_begin.strip()

    def call_text(self, name: str, arguments: object) -> str:
        if isinstance(arguments, str):
            # A client's earlier call that was not JSON is shown as the string it was.
            arguments = parsed_arguments(arguments)
        if self.style == "qwen_xml":
            return f"{self.call_begin}{xml_call_body(name, arguments)}{self.call_end}"
        body = json.dumps({"name": name, "arguments": arguments}, ensure_ascii=False)
        return f"{self.call_begin}{body}{self.call_end}"

    def calls_text(self, calls: Sequence[tuple[str, object]]) -> str:
        """One answer's calls ((name, arguments) pairs) as the model writes them."""
        blocks = self.separator.join(self.call_text(name, args) for name, args in calls)
        return f"{self.list_begin}{blocks}{self.list_end}"

    def new_call_id(self) -> str:
        if self.short_call_ids:
            alphabet = string.ascii_letters + string.digits
            return "".join(secrets.choice(alphabet) for _ in range(9))
        return f"call_{uuid.uuid4().hex[:24]}"


HERMES = ToolCallFormat()
QWEN_XML = ToolCallFormat(style="qwen_xml")


def xml_call_body(name: str, arguments: object) -> str:
    """`<function=NAME>` ... `</function>` as Qwen3.5's chat template renders a call."""
    blocks = [f"<function={name}>\n"]
    items = arguments.items() if isinstance(arguments, dict) else []
    for key, value in items:
        text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
        blocks.append(f"<parameter={key}>\n{text}\n</parameter>\n")
    blocks.append("</function>")
    return "".join(blocks)


def format_of_template(render_call) -> ToolCallFormat:
    """The format a chat template writes calls in: `render_call(message)` renders one
    assistant message holding a probe call; `<function=` in it means Qwen XML."""
    probe = {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {
                "type": "function",
                "function": {"name": "iris_probe_tool", "arguments": {"iris_arg": "x"}},
            }
        ],
    }
    try:
        text = render_call(probe)
    except Exception:  # a template that cannot render calls: Iris's own (Hermes) instruction
        return HERMES
    return QWEN_XML if "<function=iris_probe_tool>" in text else HERMES


MISTRAL = ToolCallFormat(
    call_begin="",
    call_end="",
    result_begin="[TOOL_RESULTS]",
    result_end="[/TOOL_RESULTS]",
    separator=", ",
    list_begin="[TOOL_CALLS][",
    list_end="]",
    marker_is_control=True,
    short_call_ids=True,
)


def tool_instruction(tools: Sequence[dict], fmt: ToolCallFormat = HERMES) -> str:
    """The system text that describes `tools` (OpenAI tool objects) and the call format."""
    listed = "\n".join(json.dumps(tool, ensure_ascii=False) for tool in tools)
    example = fmt.calls_text([("<the function's name>", {"<parameter>": "<value>"})])
    return (
        "You can call functions to help answer the user. These are the functions, one JSON "
        f"object per line:\n<tools>\n{listed}\n</tools>\n\n"
        "To call a function, answer with one block per call, exactly like this:\n"
        f"{example}\n"
        "Use only the functions listed, and arguments that match their parameters."
    )


def with_tool_instruction(
    messages: Sequence[dict], tools: Sequence[dict] | None, fmt: ToolCallFormat = HERMES
) -> list[dict]:
    """Messages for a template without tool support: the instruction joins (or becomes) the
    first system message; assistant tool calls and tool results become plain text."""
    converted = [_as_text(message, fmt) for message in messages]
    if not tools:
        return converted
    instruction = tool_instruction(tools, fmt)
    if converted and converted[0].get("role") in ("system", "developer"):
        first = converted[0]
        text = _text_of(first.get("content"))
        content = f"{text}\n\n{instruction}" if text else instruction
        return [{**first, "role": "system", "content": content}, *converted[1:]]
    return [{"role": "system", "content": instruction}, *converted]


def for_tool_template(messages: Sequence[dict]) -> list[dict]:
    """Messages for a template that renders tools: call arguments as objects (the HF
    convention; OpenAI sends them as JSON strings)."""
    result = []
    for message in messages:
        calls = message.get("tool_calls")
        if calls:
            message = {**message, "tool_calls": [_call_for_template(call) for call in calls]}
        result.append(message)
    return result


def _call_for_template(call: dict) -> dict:
    function = dict(call.get("function") or {})
    arguments = function.get("arguments")
    if isinstance(arguments, str):
        function["arguments"] = parsed_arguments(arguments)
    return {**call, "function": function}


def _as_text(message: dict, fmt: ToolCallFormat) -> dict:
    role = message.get("role")
    if role == "tool":
        text = _text_of(message.get("content"))
        return {"role": "user", "content": f"{fmt.result_begin}{text}{fmt.result_end}"}
    calls = message.get("tool_calls")
    if role == "assistant" and calls:
        written = fmt.calls_text(
            [(call["function"]["name"], call["function"].get("arguments", {})) for call in calls]
        )
        text = _text_of(message.get("content"))
        parts = ([text] if text else []) + [written]
        rest = {key: value for key, value in message.items() if key != "tool_calls"}
        return {**rest, "content": "\n".join(parts)}
    return message


def _text_of(content) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    return "".join(part.get("text", "") for part in content if part.get("type") == "text")
