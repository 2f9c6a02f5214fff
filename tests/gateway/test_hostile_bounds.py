"""Bounds: every list and string a request carries is bounded before the request is
materialised, and each refusal names the field, the value and the limit (a real gateway
process: tests/gateway/hostile_door.py). The body's bytes, JSON values and objects are
counted per route before any parse; the schema's list bounds are checked by pydantic before
the items; a token-id prompt never passes the model's context."""

from __future__ import annotations

from gateway.api.schemas import MAX_MESSAGES, MAX_STOP, MAX_STOP_CHARS
from tests.gateway.hostile_door import LIMITS, openai_error


def test_each_route_has_its_own_byte_cap(hostile):
    cap = LIMITS["max_completions_body_bytes"]
    refused = hostile.complete(prompt="a" * (cap + 10))
    error = openai_error(refused, 413)
    assert f"limit of {cap} bytes for /v1/completions" in error["message"]
    # The same text fits the chat route's larger cap (and the context refuses it there).
    accepted = hostile.chat(messages=[{"role": "user", "content": "a" * (cap + 10)}])
    assert openai_error(accepted, 400)["code"] == "context_length_exceeded"


def test_a_body_of_many_values_is_refused_before_it_is_parsed(hostile):
    limit = LIMITS["max_body_values"]
    ids = [1] * (limit + 1)  # short in bytes, long in values
    error = openai_error(hostile.complete(prompt=ids), 413)
    assert f"JSON values (counted by commas), over the limit of {limit}" in error["message"]


def test_a_body_of_many_objects_is_refused_before_it_is_parsed(hostile):
    limit = LIMITS["max_body_objects"]
    parts = [{"type": "text", "text": ""}] * (limit + 1)
    error = openai_error(hostile.chat(messages=[{"role": "user", "content": parts}]), 413)
    assert f"JSON objects (counted by '{{'), over the limit of {limit}" in error["message"]


def test_messages_are_bounded(hostile):
    messages = [{"role": "user", "content": "a"}] * (MAX_MESSAGES + 1)
    error = openai_error(hostile.chat(messages=messages), 400)
    assert error["param"] == "messages"
    assert f"at most {MAX_MESSAGES}" in error["message"]
    assert str(MAX_MESSAGES + 1) in error["message"]


def test_stop_strings_are_bounded_in_count_and_length(hostile):
    error = openai_error(hostile.chat(stop=["x"] * (MAX_STOP + 1)), 400)
    assert error["param"] == "stop"
    assert f"at most {MAX_STOP}" in error["message"]
    error = openai_error(hostile.chat(stop=["ok", "y" * (MAX_STOP_CHARS + 1)]), 400)
    assert error["param"].startswith("stop")
    assert f"stop.1: String should have at most {MAX_STOP_CHARS} characters" in error["message"]


def test_a_token_id_prompt_never_passes_the_context(hostile):
    context = LIMITS["max_model_len"]
    error = openai_error(hostile.complete(prompt=[1] * context), 400)
    assert error["code"] == "context_length_exceeded"
    assert f"{context} token ids" in error["message"]
    assert f"context is {context}" in error["message"]


def test_prompt_lists_are_checked_in_one_pass(hostile):
    error = openai_error(hostile.complete(prompt=[1, 2, "three"]), 400)
    assert error["param"] == "prompt"
    assert "token id 2 is 'three'" in error["message"]
    error = openai_error(hostile.complete(prompt=["a"] * 129), 400)
    assert "129 strings, over the limit of 128" in error["message"]


def test_tools_and_logit_bias_are_bounded(hostile):
    tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
    tools = [{**tool, "function": {**tool["function"], "name": f"f{i}"}} for i in range(129)]
    error = openai_error(hostile.chat(tools=tools), 400)
    assert (error["param"], "129 entries, over the limit of 128") == (
        "tools",
        error["message"][len("tools has ") :],
    )
    bias = {str(i): 1 for i in range(301)}
    error = openai_error(hostile.chat(logit_bias=bias), 400)
    assert "301 entries, over the limit of 300" in error["message"]


def test_a_deeply_nested_body_is_a_400(hostile):
    body = b'{"model": "m", "messages": ' + b"[" * 50_000 + b"]" * 50_000 + b"}"
    openai_error(hostile.post("/v1/chat/completions", body), 400)
