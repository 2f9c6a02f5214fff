"""Nesting and reprs: recursion anywhere (tool-call arguments, schemas, content, the body
itself, a model's own tool-call output) is a clean 4xx or served, never a 500, and no
error message carries an object repr, an address or a file path (a real gateway process:
tests/gateway/hostile_door.py; `openai_error` checks every message for leaks)."""

from __future__ import annotations

import base64
import json

from gateway.api.tool_calls import ToolCallStream
from iris.models.tool_format import HERMES, parsed_arguments
from tests.gateway.hostile_door import openai_error

DEEP = "[" * 20_000 + "]" * 20_000


def calling(arguments: str) -> list[dict]:
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": arguments}}
    return [
        {"role": "user", "content": "x"},
        {"role": "assistant", "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c1", "content": "done"},
    ]


def test_deep_tool_call_arguments_are_served_as_text(hostile):
    # Deeper than the template may walk: served, the arguments rendered as their text.
    shallow = "[" * 200 + "]" * 200
    response = hostile.chat(messages=calling(shallow), max_tokens=2)
    assert response.status_code == 200, response.text
    # 20,000 levels: past the JSON parser's own recursion. Its text is longer than this
    # gateway's small context allows: refused as that, not a 500.
    error = openai_error(hostile.chat(messages=calling(DEEP), max_tokens=2), 400)
    assert error["code"] == "context_length_exceeded"
    assert parsed_arguments(DEEP) == DEEP  # kept as the string it came as
    assert parsed_arguments(shallow) == shallow
    assert parsed_arguments('{"a": [1]}') == {"a": [1]}


def test_a_deep_schema_is_a_400_naming_it(hostile):
    schema = '{"type":"object","properties":{"a":' * 400 + "{}" + "}}" * 400
    fmt = '{"type":"json_schema","json_schema":{"name":"d","schema":' + schema + "}}"
    body = (
        f'{{"model":"{hostile.model}","messages":[{{"role":"user","content":"x"}}],'
        f'"response_format":{fmt}}}'
    )
    error = openai_error(hostile.post("/v1/chat/completions", body.encode()), 400)
    assert error["param"] == "response_format.json_schema.schema"
    assert "over the limit of 32" in error["message"]


def test_a_deep_body_and_deep_content_are_400s(hostile):
    body = b'{"model":"m","messages":' + b"[" * 40_000 + b"]" * 40_000 + b"}"
    openai_error(hostile.post("/v1/chat/completions", body), 400)
    nested = json.loads("[" * 500 + '"x"' + "]" * 500)
    error = openai_error(hostile.chat(messages=[{"role": "user", "content": nested}]), 400)
    assert error["param"].startswith("messages.0.content")
    deep_bias = json.loads('{"1":' * 500 + "1" + "}" * 500)
    openai_error(hostile.chat(logit_bias=deep_bias), 400)


def test_a_models_deep_tool_call_stays_content():
    stream = ToolCallStream(HERMES, {"f"})
    body = '{"name": "f", "arguments": ' + "[" * 5_000 + "]" * 5_000 + "}"
    deltas = stream.feed(f"<tool_call>{body}</tool_call>") + stream.close()
    assert not stream.calls
    assert "".join(delta.get("content", "") for delta in deltas).startswith("<tool_call>")


def test_a_non_image_names_no_stream_object(hostile):
    junk = "data:image/png;base64," + base64.b64encode(b"not an image at all").decode()
    part = {"type": "image_url", "image_url": {"url": junk}}
    error = openai_error(hostile.chat(messages=[{"role": "user", "content": [part]}]), 400)
    assert error["code"] == "invalid_image"
    assert "BytesIO" not in error["message"]
