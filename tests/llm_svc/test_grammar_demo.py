"""Constrained decoding on the demo model (SmolLM2-135M-Instruct, a real language model):
an extraction schema and a forced tool call, rendered through the adapter's prompt."""

from __future__ import annotations

import json

import jsonschema
import pytest

from gateway.api.tool_calls import parse_answer
from gateway.api.tools import calls_format
from iris.models import load_adapter
from llm_svc.engine import SamplingParams
from llm_svc.engine.grammar import Constraint, ConstraintKind
from tests.llm_svc.conftest import make_engine, run_all

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 20},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
        "city": {"type": "string", "maxLength": 20},
    },
    "required": ["name", "age", "city"],
}
WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "maxLength": 20}},
            "required": ["city"],
        },
    },
}


@pytest.fixture(scope="module")
def demo(demo_dir):
    engine = make_engine(demo_dir, max_num_batched_tokens=256, num_pages=512)
    yield engine, load_adapter(demo_dir)
    engine.close()


def ids_of(adapter, messages, tools=None) -> list[int]:
    return adapter.encode_prompt(adapter.apply_chat_template(messages, tools=tools))


def test_demo_model_extracts_json_that_validates(demo):
    engine, adapter = demo
    text = "Alice is 34 years old and lives in Paris. Give her name, age and city as JSON."
    prompt = ids_of(adapter, [{"role": "user", "content": text}])
    constraint = Constraint(ConstraintKind.JSON_SCHEMA, json.dumps(PERSON))
    requests = {
        "greedy": (prompt, SamplingParams(temperature=0.0, max_tokens=50, constraint=constraint)),
        "sampled": (
            prompt,
            SamplingParams(temperature=0.7, seed=1, max_tokens=50, constraint=constraint),
        ),
    }
    outputs = run_all(engine, requests)
    text = "".join(out.new_text for out in outputs["greedy"])
    assert "Alice" in text and "34" in text  # a real model reads the sentence
    for outs in outputs.values():
        assert outs[-1].finish_reason == "stop"
        jsonschema.validate(json.loads("".join(out.new_text for out in outs)), PERSON)


def test_demo_model_makes_a_forced_tool_call(demo):
    engine, adapter = demo
    fmt = adapter.tool_call_format
    messages = [{"role": "user", "content": "What is the weather in Rome?"}]
    prompt = ids_of(adapter, messages, tools=[WEATHER_TOOL])
    tag = {"type": "structural_tag", "format": calls_format([WEATHER_TOOL], fmt, False)}
    constraint = Constraint(ConstraintKind.STRUCTURAL_TAG, json.dumps(tag))
    params = SamplingParams(temperature=0.0, max_tokens=40, constraint=constraint)
    outs = run_all(engine, {"call": (prompt, params)})["call"]
    assert outs[-1].finish_reason == "stop"
    content, calls = parse_answer("".join(out.new_text for out in outs), fmt, {"get_weather"})
    assert content is None and len(calls) == 1
    assert calls[0]["function"]["name"] == "get_weather"
    jsonschema.validate(
        json.loads(calls[0]["function"]["arguments"]), WEATHER_TOOL["function"]["parameters"]
    )
