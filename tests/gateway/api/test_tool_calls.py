"""Tool-call parsing (whole and streamed) and the output plans of tools / tool_choice,
without a model: the parser and planner are pure functions of text and request."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from gateway.api.structured import SchemaLimits
from gateway.api.tool_calls import ToolCallStream, parse_answer, tool_call_stream
from gateway.api.tools import plan_chat_output
from gateway.errors import APIError
from iris.models.tool_format import HERMES, MISTRAL

NAMES = {"add", "get_weather"}
TWO_CALLS = (
    'Let me check.\n<tool_call>\n{"name": "add", "arguments": {"a": 1}}\n</tool_call>\n'
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Rome"}}\n</tool_call>'
)


def test_whole_answer_with_parallel_calls():
    content, calls = parse_answer(TWO_CALLS, HERMES, NAMES)
    assert content == "Let me check."
    assert [call["function"]["name"] for call in calls] == ["add", "get_weather"]
    assert json.loads(calls[1]["function"]["arguments"]) == {"city": "Rome"}
    assert all(call["id"].startswith("call_") and call["type"] == "function" for call in calls)
    assert len({call["id"] for call in calls}) == 2


@pytest.mark.parametrize("size", [1, 3, 7, 1000])
def test_streaming_in_any_pieces_agrees_with_the_whole_answer(size):
    stream = ToolCallStream(HERMES, NAMES)
    deltas = []
    for start in range(0, len(TWO_CALLS), size):
        deltas += stream.feed(TWO_CALLS[start : start + size])
    deltas += stream.close()
    content = "".join(delta.get("content", "") for delta in deltas)
    calls = [call for delta in deltas for call in delta.get("tool_calls", [])]
    assert content == "Let me check."
    assert [call["index"] for call in calls] == [0, 1]
    assert [call["function"]["name"] for call in calls] == ["add", "get_weather"]


def test_text_that_may_open_a_call_is_held_back_until_it_cannot():
    stream = ToolCallStream(HERMES, NAMES)
    assert stream.feed("a <tool_") == [{"content": "a"}]
    assert stream.feed("box>") == [{"content": " <tool_box>"}]


@pytest.mark.parametrize(
    "block",
    [
        "<tool_call>\n{not json}\n</tool_call>",
        '<tool_call>\n{"name": "rm_rf", "arguments": {}}\n</tool_call>',
        '<tool_call>\n{"name": "add", "arguments": [1]}\n</tool_call>',
        '<tool_call>\n{"name": "add", "arguments": {}}',  # never closed
    ],
)
def test_blocks_that_are_not_valid_calls_stay_content(block):
    content, calls = parse_answer(block, HERMES, NAMES)
    assert calls == [] and content == block


def _body(**fields):
    base = dict(response_format=None, tools=None, tool_choice=None, parallel_tool_calls=None)
    return SimpleNamespace(**{**base, **fields})


TOOLS = [
    {"type": "function", "function": {"name": name, "parameters": {"type": "object"}}}
    for name in sorted(NAMES)
]
LIMITS = SchemaLimits(1 << 16, 32)


def _tag(plan) -> dict:
    return json.loads(plan.constraint.value)["format"]


def test_plans_for_each_tool_choice():
    none = plan_chat_output(_body(tools=TOOLS, tool_choice="none"), LIMITS, 8, HERMES)
    assert none.tools is None and none.constraint is None and not none.parse_tools
    auto = plan_chat_output(_body(tools=TOOLS), LIMITS, 8, HERMES)
    assert auto.tools and auto.parse_tools and auto.constraint is None
    required = plan_chat_output(_body(tools=TOOLS, tool_choice="required"), LIMITS, 8, HERMES)
    assert _tag(required)["type"] == "sequence"  # one call, then any more (parallel)
    single = plan_chat_output(
        _body(tools=TOOLS, tool_choice="required", parallel_tool_calls=False), LIMITS, 8, HERMES
    )
    assert _tag(single)["type"] == "or" and required.constraint_param == "tools"
    named = plan_chat_output(
        _body(tools=TOOLS, tool_choice={"type": "function", "function": {"name": "add"}}),
        LIMITS, 8, HERMES,
    )  # fmt: skip
    assert _tag(named)["type"] == "tag" and '"add"' in _tag(named)["begin"]
    schema = {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object"}}}
    either = plan_chat_output(_body(tools=TOOLS, response_format=schema), LIMITS, 8, HERMES)
    assert _tag(either)["type"] == "or" and either.constraint_param == "response_format"


def test_too_many_tools_and_duplicates_are_refused():
    with pytest.raises(APIError, match="over the limit of 1"):
        plan_chat_output(_body(tools=TOOLS), LIMITS, 1, HERMES)
    with pytest.raises(APIError, match="listed twice"):
        plan_chat_output(_body(tools=[TOOLS[0], TOOLS[0]]), LIMITS, 8, HERMES)


# Mistral's list format: the [TOOL_CALLS] control token, then every call in one JSON list.
MISTRAL_CALLS = (
    'Let me check. [TOOL_CALLS][{"name": "add", "arguments": {"a": 1, "s": "x]}\\"["}}, '
    '{"name": "get_weather", "arguments": {"city": "Rome"}}]'
)


def _streamed(fmt, text: str, cuts: list[int]) -> tuple[str, list[dict]]:
    stream = tool_call_stream(fmt, NAMES)
    deltas = []
    for start, end in zip([0, *cuts], [*cuts, len(text)], strict=True):
        deltas += stream.feed(text[start:end])
    deltas += stream.close()
    content = "".join(delta.get("content", "") for delta in deltas)
    return content, [call for delta in deltas for call in delta.get("tool_calls", [])]


def test_mistral_whole_answer_with_parallel_calls():
    content, calls = parse_answer(MISTRAL_CALLS, MISTRAL, NAMES)
    assert content == "Let me check."
    assert [call["function"]["name"] for call in calls] == ["add", "get_weather"]
    assert json.loads(calls[0]["function"]["arguments"]) == {"a": 1, "s": 'x]}"['}
    # Mistral's templates take only 9 letters and digits as a call's id.
    assert all(len(call["id"]) == 9 and call["id"].isalnum() for call in calls)


@pytest.mark.parametrize("second", [None, 1, 2, 3])
def test_mistral_stream_cut_anywhere_agrees_with_the_whole_answer(second):
    """Every single cut of the answer (and, with `second`, pairs of nearby cuts)."""
    for cut in range(1, len(MISTRAL_CALLS)):
        cuts = (
            [cut] if second is None or cut + second >= len(MISTRAL_CALLS) else [cut, cut + second]
        )
        content, calls = _streamed(MISTRAL, MISTRAL_CALLS, cuts)
        assert content == "Let me check.", cuts
        assert [call["index"] for call in calls] == [0, 1], cuts
        assert [call["function"]["name"] for call in calls] == ["add", "get_weather"], cuts
        assert json.loads(calls[1]["function"]["arguments"]) == {"city": "Rome"}


def test_mistral_one_character_at_a_time_and_text_after_the_list():
    text = '[TOOL_CALLS] {"name": "add", "arguments": {}} done'
    content, calls = _streamed(MISTRAL, text, list(range(1, len(text))))
    assert content == "done" and [call["function"]["name"] for call in calls] == ["add"]


def test_mistral_marker_prefix_is_held_back_until_it_cannot_open_a_call():
    stream = tool_call_stream(MISTRAL, NAMES)
    assert stream.feed("a [TOOL_") == [{"content": "a"}]
    assert stream.feed("BOX]") == [{"content": " [TOOL_BOX]"}]


@pytest.mark.parametrize(
    "block",
    [
        "[TOOL_CALLS][{not json}]",
        '[TOOL_CALLS][{"name": "rm_rf", "arguments": {}}]',
        '[TOOL_CALLS][{"name": "add", "arguments": {}}, {"name": "add", "arguments": [1]}]',
        "[TOOL_CALLS][]",
        '[TOOL_CALLS]"add"',
        '[TOOL_CALLS][{"name": "add", "arguments": {}}',  # never closed
    ],
)
def test_mistral_lists_that_are_not_valid_calls_stay_content(block):
    content, calls = parse_answer(block, MISTRAL, NAMES)
    assert calls == [] and content == block
    assert _streamed(MISTRAL, block, list(range(1, len(block))))[0] == block


def test_mistral_forced_calls_are_a_list_after_the_marker():
    required = plan_chat_output(_body(tools=TOOLS, tool_choice="required"), LIMITS, 8, MISTRAL)
    tag = _tag(required)
    assert tag["type"] == "sequence"
    first, calls, last = tag["elements"]
    assert first == {"type": "const_string", "value": "[TOOL_CALLS]["}
    assert last == {"type": "const_string", "value": "]"}
    separator = calls["elements"][1]["content"]["elements"][0]
    assert separator == {"type": "const_string", "value": ", "}
    named = plan_chat_output(
        _body(tools=TOOLS, tool_choice={"type": "function", "function": {"name": "add"}}),
        LIMITS, 8, MISTRAL,
    )  # fmt: skip
    call = _tag(named)["elements"][1]
    assert call["begin"] == '{"name": "add", "arguments": ' and call["end"] == "}"
