"""The gateway's static grammar check (gateway/api/grammar_limits.py): a constraint whose
grammar would be large is a 400 naming the limit before any pod sees it, whichever field
it came through; ordinary and near-limit constraints pass."""

from __future__ import annotations

import json

import pytest

from gateway.api.grammar_limits import GrammarLimits, check_grammar
from gateway.errors import APIError
from iris.proto import common_pb2
from tests.fixtures.schemas import SCHEMAS

Kind = common_pb2.Constraint
LIMITS = GrammarLimits()


def verdict(kind, value) -> str:
    try:
        check_grammar(Kind(kind=kind, value=value), LIMITS, "response_format")
    except APIError as err:
        assert err.status == 400 and err.param == "response_format"
        return err.message
    return "ok"


def schema(document: dict) -> str:
    return json.dumps(document)


@pytest.mark.parametrize(
    "kind, value, limit",
    [
        (Kind.REGEX, "[a-z]{1,12000}", "grammar_max_repeat = 1000"),
        (Kind.REGEX, '"[a-z]{1,12000}"', "grammar_max_repeat"),  # quotes hide nothing
        (Kind.REGEX, "(a{1,1000}b{3}){1,1000}", "grammar_max_total_repeat"),
        (Kind.REGEX, "|".join(f"w{i}" for i in range(1001)), "grammar_max_enum"),
        (Kind.REGEX, "(" * 5000 + "a" + ")" * 5000, "group depth = 64"),
        (Kind.JSON_SCHEMA, schema({"type": "string", "maxLength": 12000.0}), "maxLength"),
        (Kind.EBNF, 'root ::= [a-z]{0,5000} "x"', "grammar_max_repeat"),
        (Kind.JSON_SCHEMA, schema({"type": "string", "pattern": "[a-z]{1,20000}"}), "20000"),
        (Kind.JSON_SCHEMA, schema({"type": "string", "maxLength": 1001}), "maxLength = 1001"),
        (
            Kind.JSON_SCHEMA,
            schema({"type": "array", "maxItems": 1000, "items": {"maxLength": 1000}}),
            "grammar_max_total_repeat",
        ),
        (Kind.JSON_SCHEMA, schema({"enum": list(range(1001))}), "grammar_max_enum"),
        (Kind.JSON_SCHEMA, schema({"const": "x" * (300 << 10)}), "grammar_max_bytes"),
        (
            Kind.STRUCTURAL_TAG,
            schema({"type": "json_schema", "json_schema": {"minItems": 5000}}),
            "minItems = 5000",
        ),
    ],
)
def test_large_grammars_are_refused_naming_the_limit(kind, value, limit):
    message = verdict(kind, value)
    assert message != "ok" and limit in message


@pytest.mark.parametrize(
    "kind, value",
    [
        (Kind.REGEX, "[a-z]{1,1000}"),
        (Kind.REGEX, "[{]{1,2}(ab){3,}"),
        (Kind.EBNF, 'root ::= "{1,99999}" [a-z]{1,10}'),  # a quoted literal in EBNF
        (Kind.JSON_SCHEMA, schema({"type": "string", "pattern": "[0-9]{1,1000}"})),
        (Kind.JSON_SCHEMA, schema({"type": "array", "maxItems": 50, "items": {"maxLength": 200}})),
        *((Kind.JSON_SCHEMA, schema(document)) for document in SCHEMAS.values()),
    ],
)
def test_ordinary_and_near_limit_grammars_pass(kind, value):
    assert verdict(kind, value) == "ok"


def test_each_field_is_refused_with_a_400_before_any_pod_call(
    client, model_name, qwen_gateway_parts
):
    pod = qwen_gateway_parts["pod"]
    pod.reset()
    hostile = {"type": "object", "properties": {"s": {"type": "string", "pattern": "a{1,12000}"}}}
    message = [{"role": "user", "content": "hi"}]
    cases = {
        "response_format": {
            "messages": message,
            "response_format": {
                "type": "json_schema",
                "json_schema": {"name": "x", "schema": hostile},
            },
        },
        "tools": {
            "messages": message,
            "tools": [{"type": "function", "function": {"name": "f", "parameters": hostile}}],
            "tool_choice": "required",
        },
    }
    for param, body in cases.items():
        answer = client.post("/v1/chat/completions", json={"model": model_name, **body})
        assert answer.status_code == 400, answer.text
        error = answer.json()["error"]
        assert error["param"] == param and "grammar_max_repeat = 1000" in error["message"]
    answer = client.post(
        "/v1/completions",
        json={
            "model": model_name,
            "prompt": "hi",
            "response_format": cases["response_format"]["response_format"],
        },
    )
    assert answer.status_code == 400 and "grammar_max_repeat" in answer.json()["error"]["message"]
    assert pod.requests == []
