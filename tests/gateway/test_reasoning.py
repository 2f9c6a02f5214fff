"""Reasoning end to end: the official `openai` client, the gateway and real cache, encoder
and LLM processes on a tiny model that thinks (tests/fixtures/thinking.py: the tiny random
Qwen2-VL with `<think>`/`</think>` added to its tokenizer and a Qwen3-style template).

Random tiny weights never write `</think>` by themselves, so a thought left alone runs to
max_tokens and comes back whole as `reasoning_content` (content null), as vLLM and SGLang
answer a thought cut short. To reach the answer after a thought the tests bias the model's
own `</think>` id (read from its tokenizer) with `logit_bias` +100: it is then sampled first,
and the JSON schema's grammar, dormant during the thought, masks it from then on, so the
answer must be schema-valid JSON. Were the grammar applied to the thought, `</think>` would
be masked at once and the whole output would be a thought with no answer: the schema tests
fail. (A non-empty thought followed by a grammar is tested against the real matcher in
tests/llm_svc/test_reasoning_grammar.py.)"""

from __future__ import annotations

import json

import jsonschema
import pytest

from tests.fixtures.platform import start_platform

openai = pytest.importorskip("openai")

USER = [{"role": "user", "content": "What is the capital of France?"}]
SCHEMA = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 8}},
    "required": ["city"],
    "additionalProperties": False,
}
FORMAT = {"type": "json_schema", "json_schema": {"name": "city", "schema": SCHEMA}}
OFF = {"chat_template_kwargs": {"enable_thinking": False}}


@pytest.fixture(scope="module")
def thinking_platform(tmp_path_factory, tiny_thinking_dir):
    running = start_platform(tiny_thinking_dir, tmp_path_factory.mktemp("thinking-platform"))
    yield running
    running.stop()


@pytest.fixture(scope="module")
def client(thinking_platform):
    return thinking_platform.openai_client(max_retries=0)


@pytest.fixture(scope="module")
def think_end_id(tiny_thinking_dir) -> int:
    from iris.models import load_adapter

    return load_adapter(tiny_thinking_dir).reasoning.markers.end_id


def create(client, platform, **kwargs):
    return client.chat.completions.create(
        model=platform.model_name, messages=USER, temperature=0, **kwargs
    )


def test_a_thought_comes_back_as_reasoning_content(thinking_platform, client):
    reply = create(client, thinking_platform, max_tokens=8)
    message = reply.choices[0].message
    assert message.reasoning_content and message.content is None
    assert reply.choices[0].finish_reason == "length"


def test_without_thinking_the_output_is_all_answer(thinking_platform, client):
    thinking = create(client, thinking_platform, max_tokens=8)
    plain = create(client, thinking_platform, max_tokens=8, extra_body=OFF)
    message = plain.choices[0].message
    assert message.content and getattr(message, "reasoning_content", None) is None
    # The template rendered the closed, empty thought into the prompt: 6 more tokens.
    assert plain.usage.prompt_tokens == thinking.usage.prompt_tokens + 6


def test_streamed_thought_and_answer_arrive_as_their_deltas(thinking_platform, client):
    def deltas(**kwargs):
        stream = create(client, thinking_platform, max_tokens=8, stream=True, **kwargs)
        thought, answer = "", ""
        for chunk in stream:
            delta = chunk.choices[0].delta
            thought += getattr(delta, "reasoning_content", None) or ""
            answer += delta.content or ""
        return thought, answer

    whole = create(client, thinking_platform, max_tokens=8).choices[0].message
    assert deltas() == (whole.reasoning_content, "")
    plain = create(client, thinking_platform, max_tokens=8, extra_body=OFF).choices[0].message
    assert deltas(extra_body=OFF) == ("", plain.content)


def test_a_json_schema_applies_to_the_answer_after_the_thought(
    thinking_platform, client, think_end_id
):
    bias = {str(think_end_id): 100}
    reply = create(client, thinking_platform, max_tokens=40, response_format=FORMAT,
                   logit_bias=bias)  # fmt: skip
    message = reply.choices[0].message
    assert reply.choices[0].finish_reason == "stop"
    assert message.reasoning_content is None  # the thought ended at its first token
    jsonschema.validate(json.loads(message.content), SCHEMA)
    # Streamed: the same answer, as content deltas.
    stream = create(client, thinking_platform, max_tokens=40, response_format=FORMAT,
                    logit_bias=bias, stream=True)  # fmt: skip
    chunks = [chunk.choices[0].delta for chunk in stream if chunk.choices]
    assert "".join(delta.content or "" for delta in chunks) == message.content
    assert not any(getattr(delta, "reasoning_content", None) for delta in chunks)


def test_without_thinking_the_grammar_holds_from_the_first_token(
    thinking_platform, client, think_end_id
):
    reply = create(client, thinking_platform, max_tokens=40, response_format=FORMAT,
                   logit_bias={str(think_end_id): 100}, extra_body=OFF)  # fmt: skip
    content = reply.choices[0].message.content
    # The bias would have put `</think>` first; the grammar allowed only `{` there (it may
    # still allow the marker's text inside a JSON string).
    assert content.startswith("{")
    jsonschema.validate(json.loads(content), SCHEMA)


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"reasoning_effort": "high"}, "does not take reasoning_effort"),
        ({"reasoning_effort": "extreme"}, "is not one of minimal, low, medium, high"),
        ({"chat_template_kwargs": {"foo": 1}}, "chat_template_kwargs.foo is not supported"),
        ({"chat_template_kwargs": {"enable_thinking": "yes"}}, "must be true or false"),
        ({"enable_thinking": True}, "use chat_template_kwargs.enable_thinking"),
    ],
)
def test_reasoning_fields_the_template_does_not_take_are_refused(
    thinking_platform, client, extra, message
):
    with pytest.raises(openai.BadRequestError, match=message):
        create(client, thinking_platform, max_tokens=2, extra_body=extra)
