"""Plain language models (no adapter of their own) served end to end under `iris up`: the
text-only adapter (iris/models/text_only.py) behind the real gateway, with no encoder
started, asked through the official openai client. Tiny Qwen3 with a thinking template and
tiny Qwen3.5 (hybrid Gated DeltaNet), each built by transformers from a small config."""

from __future__ import annotations

import json

import openai
import pytest

from iris import metrics as names
from iris.models import load_adapter
from iris.up.metrics_page import metrics_url, scrape
from tests.fixtures.platform import start_platform
from tests.fixtures.thinking import make_thinking_model

pytestmark = pytest.mark.slow

SYSTEM = "You answer in a few words. " * 12  # several pages, so a second turn can hit


@pytest.fixture(scope="module")
def qwen3_thinking(tmp_path_factory):
    from iris.models.text_tiny import build

    root = tmp_path_factory.mktemp("qwen3_text")
    build("qwen3", root / "plain")
    model_dir = make_thinking_model(root / "plain", root / "model")
    running = start_platform(model_dir, root / "logs")
    yield running
    running.stop()


@pytest.fixture(scope="module")
def qwen3_5(tmp_path_factory):
    from iris.models.qwen3_5.tiny import build

    root = tmp_path_factory.mktemp("qwen3_5_text")
    build(root / "model")
    running = start_platform(root / "model", root / "logs")
    yield running
    running.stop()


def test_no_encoder_is_started_for_a_plain_language_model(qwen3_thinking):
    assert qwen3_thinking.by_kind("encoder") == []
    assert qwen3_thinking.by_kind("gateway") and qwen3_thinking.by_kind("llm")


def test_qwen3_thinks_and_counts_its_prompt_through_the_gateway(qwen3_thinking):
    client = qwen3_thinking.openai_client()
    messages = [{"role": "user", "content": "Say something."}]
    reply = client.chat.completions.create(
        model=qwen3_thinking.model_name, messages=messages, max_tokens=12, temperature=0
    )
    adapter = load_adapter(qwen3_thinking.model_dir)
    assert reply.usage.prompt_tokens == len(adapter.chat_prompt_ids(messages))
    assert reply.usage.completion_tokens == 12
    # The thinking template opens the thought for the model: what it wrote is reasoning.
    message = reply.choices[0].message
    assert getattr(message, "reasoning_content", None) or message.content
    off = client.chat.completions.create(
        model=qwen3_thinking.model_name,
        messages=messages,
        max_tokens=4,
        temperature=0,
        extra_body={"chat_template_kwargs": {"enable_thinking": False}},
    )
    template_off = {"enable_thinking": False}
    assert off.usage.prompt_tokens == len(
        adapter.chat_prompt_ids(messages, template_kwargs=template_off)
    )
    assert off.usage.prompt_tokens > reply.usage.prompt_tokens  # the closed, empty thought


def test_an_image_part_is_refused_by_name(qwen3_thinking):
    client = qwen3_thinking.openai_client()
    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}
    content = [{"type": "text", "text": "What is this?"}, image]
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(
            model=qwen3_thinking.model_name,
            messages=[{"role": "user", "content": content}],
            max_tokens=2,
        )
    error = caught.value.body
    assert error["code"] == "images_not_supported"
    assert error["param"] == "messages[0].content[1]"
    assert "Qwen3ForCausalLM takes no images" in error["message"]


def routing_counters(platform) -> dict[str, float]:
    page = scrape(metrics_url(platform.by_kind("gateway")[0]))
    wanted = (
        names.GATEWAY_ROUTING_PREDICTED,
        names.GATEWAY_ROUTING_OVER_PREDICTIONS,
        names.GATEWAY_ROUTING_UNDER_PREDICTIONS,
    )
    return {name: page.get(name, 0.0) for name in wanted}


def test_qwen3_5_second_turn_reuses_the_first_as_the_gateway_predicted(qwen3_5):
    client = qwen3_5.openai_client()
    messages = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": "First question?"},
    ]
    first = client.chat.completions.create(
        model=qwen3_5.model_name, messages=messages, max_tokens=6, temperature=0
    )
    assert first.usage.completion_tokens == 6
    before = routing_counters(qwen3_5)
    messages += [
        {"role": "assistant", "content": first.choices[0].message.content},
        {"role": "user", "content": "And the second?"},
    ]
    second = client.chat.completions.create(
        model=qwen3_5.model_name, messages=messages, max_tokens=4, temperature=0
    )
    cached = second.usage.prompt_tokens_details.cached_tokens
    assert 0 < cached < second.usage.prompt_tokens
    after = routing_counters(qwen3_5)
    # Routing predicted a hit on the pod, and the pod's cached_tokens was neither below
    # nor above the prediction: they were equal.
    assert after[names.GATEWAY_ROUTING_PREDICTED] == before[names.GATEWAY_ROUTING_PREDICTED] + 1
    assert (
        after[names.GATEWAY_ROUTING_OVER_PREDICTIONS]
        == before[names.GATEWAY_ROUTING_OVER_PREDICTIONS]
    )
    assert (
        after[names.GATEWAY_ROUTING_UNDER_PREDICTIONS]
        == before[names.GATEWAY_ROUTING_UNDER_PREDICTIONS]
    )


WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "enum": ["Paris", "Rome"]},
                "days": {"type": "integer", "minimum": 1, "maximum": 9},
            },
            "required": ["city", "days"],
        },
    },
}
FORCED = {"type": "function", "function": {"name": "get_weather"}}


@pytest.mark.parametrize("stream", [False, True])
def test_qwen3_5_forced_tool_call_is_written_and_read_as_qwen_xml(qwen3_5, stream):
    # The format is read from the checkpoint's template (it writes `<function=...>`).
    assert load_adapter(qwen3_5.model_dir).tool_call_format.style == "qwen_xml"
    client = qwen3_5.openai_client()
    request = dict(
        model=qwen3_5.model_name,
        messages=[{"role": "user", "content": "Weather in Rome for two days?"}],
        tools=[WEATHER],
        tool_choice=FORCED,
        max_tokens=256,  # the tiny tokenizer spends about one token per character
        temperature=0,
    )
    if stream:
        chunks = list(client.chat.completions.create(stream=True, **request))
        calls = [call for chunk in chunks for call in (chunk.choices[0].delta.tool_calls or [])]
        finish = [
            chunk.choices[0].finish_reason for chunk in chunks if chunk.choices[0].finish_reason
        ]
    else:
        reply = client.chat.completions.create(**request)
        calls, finish = reply.choices[0].message.tool_calls or [], [reply.choices[0].finish_reason]
    assert finish == ["tool_calls"], (calls, finish)
    assert len(calls) == 1 and calls[0].function.name == "get_weather"
    arguments = json.loads(calls[0].function.arguments)
    assert arguments["city"] in ("Paris", "Rome") and 1 <= arguments["days"] <= 9
