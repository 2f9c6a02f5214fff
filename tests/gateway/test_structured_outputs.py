"""Structured outputs and tool calls end to end: the official `openai` client, the gateway
and real cache, encoder and LLM processes (tests/fixtures/platform.py) on the tiny random
Qwen2-VL, so only the grammar makes its answers valid."""

from __future__ import annotations

import base64
import io
import json

import httpx
import jsonschema
import pytest
from PIL import Image
from pydantic import BaseModel, Field

from tests.fixtures.schemas import SCHEMAS

openai = pytest.importorskip("openai")


def image_url() -> str:
    buffer = io.BytesIO()
    Image.new("RGB", (64, 48), "green").save(buffer, "PNG")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()


def schema_format(name: str) -> dict:
    return {"type": "json_schema", "json_schema": {"name": name, "schema": SCHEMAS[name]}}


USER = [{"role": "user", "content": "Fill in the form."}]


class Point(BaseModel):
    x: int = Field(ge=0, le=9)
    y: int = Field(ge=0, le=9)


class Extraction(BaseModel):
    label: str = Field(max_length=6)
    points: list[Point] = Field(max_length=2)
    ok: bool


class GetWeather(BaseModel):
    """The weather in a city."""

    city: str = Field(max_length=8)
    days: int = Field(ge=1, le=3)


class AddNumbers(BaseModel):
    a: int = Field(ge=0, le=9)
    b: int = Field(ge=0, le=9)


TOOLS = [openai.pydantic_function_tool(GetWeather), openai.pydantic_function_tool(AddNumbers)]


@pytest.fixture(scope="module")
def client(platform):
    return platform.openai_client(max_retries=0)


@pytest.mark.parametrize(
    "name", ["invoice", "array_of_objects", "any_of_objects", "ref_definitions"]
)
def test_json_schema_greedy_and_n3_sampled_validate(platform, client, name):
    greedy = client.chat.completions.create(
        model=platform.model_name, messages=USER, response_format=schema_format(name),
        temperature=0, max_tokens=300,
    )  # fmt: skip
    sampled = client.chat.completions.create(
        model=platform.model_name, messages=USER, response_format=schema_format(name),
        temperature=1.0, seed=5, n=3, max_tokens=300,
    )  # fmt: skip
    choices = greedy.choices + sampled.choices
    assert len(choices) == 4
    for choice in choices:
        assert choice.finish_reason == "stop"
        jsonschema.validate(json.loads(choice.message.content), SCHEMAS[name])


def test_json_schema_streamed_with_an_image_validates(platform, client):
    messages = [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "Read the chart."},
                {"type": "image_url", "image_url": {"url": image_url()}},
            ],
        }
    ]
    stream = client.chat.completions.create(
        model=platform.model_name, messages=messages,
        response_format=schema_format("chart_extraction"),
        temperature=0.7, seed=1, n=2, max_tokens=300, stream=True,
    )  # fmt: skip
    texts, reasons = ["", ""], [None, None]
    for chunk in stream:
        for choice in chunk.choices:
            texts[choice.index] += choice.delta.content or ""
            reasons[choice.index] = choice.finish_reason or reasons[choice.index]
    assert reasons == ["stop", "stop"]
    for text in texts:
        jsonschema.validate(json.loads(text), SCHEMAS["chart_extraction"])


def test_json_object_gives_a_json_object(platform, client):
    reply = client.chat.completions.create(
        model=platform.model_name, messages=USER, response_format={"type": "json_object"},
        temperature=0, max_tokens=300, logit_bias={"5": -100},
    )  # fmt: skip
    assert isinstance(json.loads(reply.choices[0].message.content), dict)


def test_parse_returns_the_pydantic_model(platform, client):
    reply = client.chat.completions.parse(
        model=platform.model_name, messages=USER, response_format=Extraction,
        temperature=0, max_tokens=300,
    )  # fmt: skip
    assert isinstance(reply.choices[0].message.parsed, Extraction)
    beta = client.beta.chat.completions.parse(
        model=platform.model_name, messages=USER, response_format=Extraction,
        temperature=1.0, seed=3, max_tokens=300,
    )  # fmt: skip
    assert isinstance(beta.choices[0].message.parsed, Extraction)


def test_required_tool_call_is_parsed_by_the_client(platform, client):
    reply = client.chat.completions.parse(
        model=platform.model_name, messages=[{"role": "user", "content": "Weather?"}],
        tools=TOOLS, tool_choice="required", parallel_tool_calls=False, temperature=0,
        max_tokens=200,
    )  # fmt: skip
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls"
    [call] = choice.message.tool_calls
    assert call.id.startswith("call_") and call.type == "function"
    assert call.function.name in ("GetWeather", "AddNumbers")
    assert isinstance(call.function.parsed_arguments, (GetWeather, AddNumbers))


def test_named_tool_call_streams_delta_tool_calls(platform, client):
    named = {"type": "function", "function": {"name": "AddNumbers"}}
    stream = client.chat.completions.create(
        model=platform.model_name, messages=[{"role": "user", "content": "Add."}],
        tools=TOOLS, tool_choice=named, temperature=1.0, seed=2, max_tokens=200, stream=True,
    )  # fmt: skip
    calls, finish = {}, None
    for chunk in stream:
        for choice in chunk.choices:
            for delta in choice.delta.tool_calls or []:
                entry = calls.setdefault(delta.index, {"name": "", "arguments": ""})
                entry["id"] = delta.id or entry.get("id")
                entry["name"] += delta.function.name or ""
                entry["arguments"] += delta.function.arguments or ""
            finish = choice.finish_reason or finish
    assert finish == "tool_calls" and list(calls) == [0]
    assert calls[0]["name"] == "AddNumbers" and calls[0]["id"].startswith("call_")
    AddNumbers.model_validate_json(calls[0]["arguments"])
    # The same request whole, through the SDK's streaming helper, agrees on the shape.
    with client.chat.completions.stream(
        model=platform.model_name, messages=[{"role": "user", "content": "Add."}],
        tools=TOOLS, tool_choice=named, temperature=0, max_tokens=200,
    ) as helper:  # fmt: skip
        final = helper.get_final_completion()
    [call] = final.choices[0].message.tool_calls
    assert isinstance(call.function.parsed_arguments, AddNumbers)


def test_auto_tools_and_a_conversation_with_tool_results(platform, client):
    messages = [
        {"role": "user", "content": "Weather in Paris?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "GetWeather", "arguments": '{"city": "Paris", "days": 1}'},
                }
            ],
        },  # fmt: skip
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
    ]
    reply = client.chat.completions.create(
        model=platform.model_name, messages=messages, tools=TOOLS, temperature=0, max_tokens=8
    )
    choice = reply.choices[0]
    # A random model writes no well-formed call: the text is content, nothing is invented.
    assert choice.finish_reason in ("stop", "length") and not choice.message.tool_calls
    assert isinstance(choice.message.content, str)


def test_completions_take_response_format_as_an_extension(platform, client):
    reply = client.completions.create(
        model=platform.model_name, prompt="JSON:", max_tokens=300, temperature=0,
        extra_body={"response_format": schema_format("flat_object")},
    )  # fmt: skip
    jsonschema.validate(json.loads(reply.choices[0].text), SCHEMAS["flat_object"])


def _deep(depth: int) -> dict:
    schema: dict = {"type": "integer"}
    for _ in range(depth):
        schema = {"type": "array", "items": schema, "maxItems": 1}
    return schema


def _fmt(schema) -> dict:
    return {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}


BAD_REQUESTS = {
    "uncompilable schema": (
        {"response_format": _fmt({"type": "object", "properties": {"a": {"$ref": "#/$defs/no"}}})},
        "response_format",
        "cannot be compiled",
    ),
    "schema too large": (
        {"response_format": _fmt({"enum": ["v" * 1000 for _ in range(80)]})},
        "response_format.json_schema.schema",
        "over the limit of 65536",
    ),
    "schema too deep": (
        {"response_format": _fmt(_deep(40))},
        "response_format.json_schema.schema",
        "over the limit of 32",
    ),
    "not a schema": (
        {"response_format": _fmt({"type": "no-such-type"})},
        "response_format.json_schema.schema",
        "not a valid JSON Schema",
    ),
    "unknown response_format type": (
        {"response_format": {"type": "yaml"}}, "response_format.type", "not supported",
    ),
    "unknown tool_choice": (
        {"tools": TOOLS, "tool_choice": "sometimes"}, "tool_choice", "not one of",
    ),
    "tool_choice without tools": ({"tool_choice": "required"}, "tool_choice", "needs tools"),
    "named function not in tools": (
        {"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "Nope"}}},
        "tool_choice",
        "not in tools",
    ),
    "malformed tool": (
        {"tools": [{"type": "function", "function": {"name": "bad name!"}}]},
        "tools[0].function.name",
        "letters, digits",
    ),
    "tool of another type": ({"tools": [{"type": "retrieval"}]}, "tools[0].type", "function"),
    "tool parameters not a schema": (
        {"tools": [{"type": "function", "function": {"name": "f", "parameters": [1]}}]},
        "tools[0].function.parameters",
        "JSON object",
    ),
    "audio output": ({"audio": {"voice": "alloy", "format": "wav"}}, "audio", "not supported"),
    "audio modality": ({"modalities": ["text", "audio"]}, "modalities", "not supported"),
    "prediction": ({"prediction": {"type": "content", "content": "x"}}, "prediction", "not"),
    "web search": ({"web_search_options": {}}, "web_search_options", "not supported"),
    "logit_bias too many": (
        {"logit_bias": {str(i): 1 for i in range(301)}}, "logit_bias", "limit of 300",
    ),
    "logit_bias out of range": ({"logit_bias": {"5": 101}}, "logit_bias", "[-100, 100]"),
    "logit_bias outside vocab": ({"logit_bias": {"448": 1}}, "logit_bias", "[0, 448)"),
}  # fmt: skip


@pytest.mark.parametrize("case", list(BAD_REQUESTS))
def test_bad_structured_input_is_a_400_naming_the_field(platform, case):
    extra, param, needle = BAD_REQUESTS[case]
    body = {"model": platform.model_name, "messages": USER, "max_tokens": 4, **extra}
    reply = httpx.post(f"{platform.gateway_url}/v1/chat/completions", json=body, timeout=60)
    assert reply.status_code == 400, reply.text
    error = reply.json()["error"]
    assert error["param"] == param and needle in error["message"], error


def test_fields_that_change_nothing_are_accepted(platform, client):
    reply = client.chat.completions.create(
        model=platform.model_name, messages=USER, max_tokens=2, user="u", metadata={"k": "v"},
        store=False, service_tier="auto", modalities=["text"],
    )  # fmt: skip
    assert reply.choices[0].message.content is not None


def test_a_very_deep_request_body_is_a_clean_4xx(platform):
    deep = "[" * 100_000 + "]" * 100_000
    head = {"model": platform.model_name, "messages": USER, "response_format": _fmt({})}
    # The schema's body is spliced in as text: json.dumps itself cannot nest that deep.
    body = json.dumps(head).replace('"schema": {}', f'"schema": {{"items": {deep}}}')
    reply = httpx.post(
        f"{platform.gateway_url}/v1/chat/completions",
        content=body,
        headers={"content-type": "application/json"},
        timeout=60,
    )
    assert reply.status_code in (400, 422), reply.text
    assert reply.json()["error"]["message"]
