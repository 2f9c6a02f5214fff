"""Fields that change the output are honoured or refused, never dropped: vLLM's guided_*
fields (and `structured_outputs`) become the pod's Constraint through the one function
that makes every constraint, stop_token_ids / min_tokens / skip_special_tokens /
include_stop_str_in_output reach the pod's SamplingParams (and the pod's engine params),
the rest are 400s naming the field, an unknown field is refused, and inconsistent values
are a 400 naming both. A real gateway process (tests/gateway/hostile_door.py); what reached
the scripted pod is read from its recorded requests."""

from __future__ import annotations

import json

import pytest

from iris.proto import common_pb2
from llm_svc.server.convert import sampling_params
from tests.gateway.hostile_door import openai_error

KIND = common_pb2.Constraint


@pytest.fixture
def pod(hostile, qwen_gateway_parts):
    fake = qwen_gateway_parts["pod"]
    fake.reset()
    return fake


def sent(pod) -> common_pb2.SamplingParams:
    assert len(pod.requests) == 1, len(pod.requests)
    return pod.requests[0].sampling


SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}


@pytest.mark.parametrize(
    ("fields", "kind", "value"),
    [
        ({"guided_json": SCHEMA}, KIND.JSON_SCHEMA, json.dumps(SCHEMA, separators=(",", ":"))),
        ({"guided_json": json.dumps(SCHEMA)}, KIND.JSON_SCHEMA, None),
        ({"guided_regex": "[a-z]{3}"}, KIND.REGEX, "[a-z]{3}"),
        ({"guided_choice": ["yes", 'no "way"']}, KIND.EBNF, 'root ::= "yes" | "no \\"way\\""'),
        ({"guided_grammar": 'root ::= "x"'}, KIND.EBNF, 'root ::= "x"'),
        ({"structured_outputs": {"regex": "b+"}}, KIND.REGEX, "b+"),
    ],
)
def test_guided_fields_become_the_pods_constraint(hostile, pod, fields, kind, value):
    for send in (hostile.chat, hostile.complete):
        pod.reset()
        response = send(**fields)
        assert response.status_code == 200, response.text
        constraint = sent(pod).constraint
        assert constraint.kind == kind
        if value is not None:
            assert constraint.value == value


def test_sampling_extensions_reach_the_pod_and_its_engine(hostile, pod):
    response = hostile.chat(
        stop_token_ids=[5, 9],
        skip_special_tokens=False,
        include_stop_str_in_output=True,
        min_tokens=2,
        max_tokens=4,
    )
    assert response.status_code == 200, response.text
    params = sent(pod)
    assert list(params.stop_token_ids) == [5, 9]
    assert params.HasField("skip_special_tokens") and not params.skip_special_tokens
    assert params.include_stop_str_in_output and params.min_tokens == 2
    engine = sampling_params(params, prompt_len=4, max_model_len=512)
    assert (engine.stop_token_ids, engine.skip_special_tokens) == ([5, 9], False)
    assert engine.include_stop_str_in_output and engine.min_tokens == 2
    # Unset: the engine's defaults.
    pod.reset()
    assert hostile.chat().status_code == 200
    engine = sampling_params(sent(pod), prompt_len=4, max_model_len=512)
    assert engine.skip_special_tokens and not engine.include_stop_str_in_output


@pytest.mark.parametrize(
    "field",
    [
        {"use_beam_search": True},
        {"prompt_logprobs": 1},
        {"truncate_prompt_tokens": 8},
        {"allowed_token_ids": [1, 2]},
        {"guided_whitespace_pattern": " "},
        {"chat_template": "{{ messages }}"},
        {"best_of": 2},
    ],
)
def test_output_changing_fields_iris_lacks_are_refused_by_name(hostile, pod, field):
    (name,) = field
    error = openai_error(hostile.chat(**field), 400)
    assert error["param"] == name
    assert name in error["message"]
    assert not pod.requests


def test_an_unknown_field_is_refused_and_harmless_ones_are_not(hostile, pod):
    error = openai_error(hostile.complete(frobnicate=1), 400)
    assert (error["param"], error["code"]) == ("frobnicate", "unknown_parameter")
    assert hostile.chat(user="u", metadata={"k": "v"}, store=False).status_code == 200


def test_inconsistent_values_name_both(hostile, pod):
    error = openai_error(hostile.chat(max_tokens=3, min_tokens=5), 400)
    assert "min_tokens = 5 is above max_tokens = 3" in error["message"]
    error = openai_error(
        hostile.chat(guided_regex="a", response_format={"type": "json_object"}), 400
    )
    assert "guided_regex and response_format both constrain the output" in error["message"]
    error = openai_error(hostile.chat(stop_token_ids=[10**9]), 400)
    assert "stop_token_ids[0] = 1000000000 is outside the vocabulary" in error["message"]
    assert not pod.requests


def test_a_bad_guided_field_is_a_400_naming_it(hostile, pod):
    error = openai_error(hostile.chat(guided_json={"type": 5}), 400)
    assert error["param"] == "guided_json"
    error = openai_error(hostile.chat(guided_json="{not json"), 400)
    assert error["param"] == "guided_json"
    error = openai_error(hostile.chat(guided_choice=[]), 400)
    assert error["param"] == "guided_choice"
    tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
    error = openai_error(hostile.chat(guided_regex="a+", tools=[tool]), 400)
    assert "cannot be combined with tools" in error["message"]


def test_an_input_audio_part_is_a_400_naming_the_part(hostile, pod):
    audio = {"type": "input_audio", "input_audio": {"data": "AAAA", "format": "wav"}}
    content = [{"type": "text", "text": "listen"}, audio]
    error = openai_error(hostile.chat(messages=[{"role": "user", "content": content}]), 400)
    assert error["param"] == "messages[0].content[1]"
    assert "input_audio" in error["message"]
    assert not pod.requests
