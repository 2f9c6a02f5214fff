"""Text-format tool-call arguments typed by the tool's schema (gateway/api/argument_types.py),
on schemas written by the official client's `openai.pydantic_function_tool`: a value is JSON
only where the parameter allows a non-string type and the JSON validates against it;
otherwise it is the text the model wrote (Optional[str], $ref'd string enums, undeclared
parameters). Read through the Qwen XML parser, which every text-format call goes through."""

from __future__ import annotations

import enum
import json
from typing import Literal

import openai
import pytest
from pydantic import BaseModel

from gateway.api.argument_types import argument_value
from gateway.api.tool_calls import parse_answer
from iris.models.tool_format import QWEN_XML


class Level(enum.StrEnum):
    low = "1"
    high = "2"


class Place(BaseModel):
    city: str
    zip: str | None


class Lookup(BaseModel):
    note: str | None
    code: str
    count: int | None
    level: Level
    mode: Literal["true", "false"]
    place: Place
    amount: int | str
    tags: list[str]
    ids: list[int] | None
    exact: bool


LOOKUP = openai.pydantic_function_tool(Lookup)["function"]
PARAMETERS = {LOOKUP["name"]: LOOKUP["parameters"]}


def arguments_of(values: dict[str, str]) -> dict:
    """The arguments the parser reads from a Qwen XML call of Lookup writing `values`."""
    blocks = "".join(f"<parameter={key}>\n{text}\n</parameter>\n" for key, text in values.items())
    answer = f"<tool_call>\n<function={LOOKUP['name']}>\n{blocks}</function>\n</tool_call>"
    content, calls = parse_answer(answer, QWEN_XML, {LOOKUP["name"]}, PARAMETERS)
    assert content is None and len(calls) == 1, (content, calls)
    return json.loads(calls[0]["function"]["arguments"])


@pytest.mark.parametrize(
    ("key", "text", "value"),
    [
        ("note", "12345", "12345"),  # Optional[str]: a string, whatever it looks like
        ("note", "true", "true"),
        ("note", "null", None),  # null is the one other type it allows
        ("code", "12345", "12345"),
        ("count", "7", 7),
        ("count", "seven", "seven"),  # not JSON: the text, for the tool to refuse
        ("level", "1", "1"),  # $ref to a string enum
        ("mode", "true", "true"),
        ("place", '{"city": "Paris", "zip": "75001"}', {"city": "Paris", "zip": "75001"}),
        ("place", '{"city": 5, "zip": null}', '{"city": 5, "zip": null}'),  # invalid: text
        ("amount", "5", 5),
        ("amount", "five", "five"),
        ("tags", '["a", "b"]', ["a", "b"]),
        ("ids", "[1, 2]", [1, 2]),
        ("ids", '["x"]', '["x"]'),
        ("exact", "true", True),
        ("extra", "12", "12"),  # undeclared: a string
        ("extra", '{"a": 1}', '{"a": 1}'),
    ],
)
def test_pydantic_function_tool_parameters_type_the_xml_arguments(key, text, value):
    assert arguments_of({key: text}) == {key: value}


ROOT = {"$defs": {"Alias": {"$ref": "#/$defs/Number"}, "Number": {"type": "number"}}}


@pytest.mark.parametrize(
    ("schema", "text", "value"),
    [
        ({"enum": ["1", "true"]}, "true", "true"),  # an enum of strings without type
        ({"enum": [1, "a"]}, "1", 1),
        ({"type": ["integer", "string"]}, "5", 5),
        ({"type": ["string", "integer"]}, "5", 5),  # the non-string branch is tried
        ({"type": ["string", "null"]}, "5", "5"),
        ({"oneOf": [{"type": "boolean"}, {"type": "string"}]}, "false", False),
        ({"anyOf": [{"type": "integer", "minimum": 10}, {"type": "string"}]}, "5", "5"),
        ({"$ref": "#/$defs/Alias"}, "2.5", 2.5),  # a $ref to a $ref
        ({"$ref": "#/$defs/Missing"}, "2.5", "2.5"),
        ({"type": "string"}, '"quoted"', '"quoted"'),
        ({}, "3", 3),  # no type told: any JSON
        (None, "3", "3"),  # undeclared
    ],
)
def test_argument_value_follows_the_schema(schema, text, value):
    assert argument_value(text, schema, ROOT) == value
    assert type(argument_value(text, schema, ROOT)) is type(value)
