"""Qwen XML tool calls (Qwen3.5, Qwen3-Coder): parsed whole and at every cut of a stream,
typed by the tool's schema, malformed blocks kept as content; the call a template renders
is the call the parser reads back; the forcing grammar accepts what the template writes.
Pure functions of text and request, plus xgrammar compiling the structural tag."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from gateway.api.structured import SchemaLimits
from gateway.api.tool_calls import ToolCallStream, parse_answer
from gateway.api.tools import plan_chat_output
from iris.models.tool_format import QWEN_XML, format_of_template

NAMES = {"add", "get_weather"}
PARAMETERS = {
    "add": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "number"}}},
    "get_weather": {
        "type": "object",
        "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
    },
}
TWO_CALLS = (
    "Let me check.\n<tool_call>\n<function=add>\n<parameter=a>\n1\n</parameter>\n"
    "<parameter=b>\n2.5\n</parameter>\n</function>\n</tool_call>\n"
    "<tool_call>\n<function=get_weather>\n<parameter=city>\n123\n</parameter>\n"
    "<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>"
)
WANT = [("add", {"a": 1, "b": 2.5}), ("get_weather", {"city": "123", "days": 3})]


def calls_of(calls: list[dict]) -> list[tuple[str, dict]]:
    return [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls]


def test_whole_answer_types_each_argument_by_its_schema():
    content, calls = parse_answer(TWO_CALLS, QWEN_XML, NAMES, PARAMETERS)
    assert content == "Let me check."
    # "123" stays a string for the string parameter city; a and days are numbers.
    assert calls_of(calls) == WANT


def test_every_cut_of_the_stream_agrees_with_the_whole_answer():
    for cut in range(len(TWO_CALLS) + 1):
        for second_cut in (cut, min(len(TWO_CALLS), cut + 5)):
            stream = ToolCallStream(QWEN_XML, NAMES, PARAMETERS)
            pieces = (TWO_CALLS[:cut], TWO_CALLS[cut:second_cut], TWO_CALLS[second_cut:])
            deltas = [delta for piece in pieces for delta in stream.feed(piece)] + stream.close()
            content = "".join(delta.get("content", "") for delta in deltas)
            streamed = [call for delta in deltas for call in delta.get("tool_calls", [])]
            assert content == "Let me check.", (cut, second_cut)
            assert calls_of(streamed) == WANT, (cut, second_cut)
            assert [call["index"] for call in streamed] == [0, 1]


@pytest.mark.parametrize(
    "block",
    [
        "<tool_call>\n<function=nope>\n</function>\n</tool_call>",  # unknown function
        '<tool_call>\n{"name": "add", "arguments": {}}\n</tool_call>',  # Hermes JSON
        "<tool_call>\n<function=add>\nstray<parameter=a>\n1\n</parameter>\n</function>\n"
        "</tool_call>",  # text between the parameters
        "<tool_call>\n<function=add>\n<parameter=a>\n1\n</function>\n</tool_call>",  # unclosed
    ],
)
def test_blocks_that_are_not_valid_xml_calls_stay_content(block):
    content, calls = parse_answer(block, QWEN_XML, NAMES, PARAMETERS)
    assert calls == [] and content == block


def test_a_call_the_format_writes_is_read_back():
    text = QWEN_XML.call_text("get_weather", '{"city": "Paris", "days": 2}')
    assert calls_of(parse_answer(text, QWEN_XML, NAMES, PARAMETERS)[1]) == [
        ("get_weather", {"city": "Paris", "days": 2})
    ]


def test_the_format_is_read_from_the_template():
    def xml_template(message):
        call = message["tool_calls"][0]["function"]
        return f"<tool_call>\n<function={call['name']}>\n</function>\n</tool_call>"

    def hermes_template(message):
        return "<tool_call>\n" + json.dumps(message["tool_calls"][0]["function"]) + "\n"

    assert format_of_template(xml_template).style == "qwen_xml"
    assert format_of_template(hermes_template).style == "json"


def test_the_forced_call_grammar_accepts_the_template_written_call():
    xgrammar = pytest.importorskip("xgrammar")
    from transformers import PreTrainedTokenizerFast

    from iris.models.tokenizer_build import build_tokenizer

    tools = [
        {"type": "function", "function": {"name": n, "parameters": PARAMETERS[n]}}
        for n in sorted(NAMES)
    ]
    body = SimpleNamespace(
        tools=tools,
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
        parallel_tool_calls=None,
        response_format=None,
    )
    limits = SchemaLimits(max_bytes=1 << 20, max_depth=32)
    plan = plan_chat_output(body, limits, 8, QWEN_XML)
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=build_tokenizer(["<|im_end|>"]))
    info = xgrammar.TokenizerInfo.from_huggingface(tokenizer)
    grammar = xgrammar.GrammarCompiler(info).compile_structural_tag(plan.constraint.value)
    written = QWEN_XML.call_text("get_weather", {"city": "Paris", "days": 2})
    assert xgrammar.GrammarMatcher(grammar).accept_string(written)
    other = QWEN_XML.call_text("add", {"a": 1})
    assert not xgrammar.GrammarMatcher(grammar).accept_string(other)
