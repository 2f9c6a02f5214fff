"""`iris up` with the tiny checkpoints of the tiled and row-broken VLM families: an image
chat through gateway, encoder, cache and pod processes, then the same image again, which
is served from the pod's prefix cache and the embedding cache (encoded once); on Mistral 3,
forced tool calls in Mistral's `[TOOL_CALLS]` format through the official openai client.
One platform per family serves all of that family's checks (started once per module)."""

from __future__ import annotations

import pytest
from pydantic import BaseModel, Field

from iris.up.processes import wait_until
from tests.e2e.helpers import image_message, image_png
from tests.e2e.test_chat import encoded_images
from tests.fixtures.platform import start_platform

openai = pytest.importorskip("openai")

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module", params=["tiny_internvl_dir", "tiny_mistral3_dir"])
def family(request, tmp_path_factory):
    running = start_platform(
        request.getfixturevalue(request.param), tmp_path_factory.mktemp(request.param)
    )
    yield running
    running.stop()


def test_image_chat_then_the_same_image_from_the_cache(family):
    client = family.openai_client()
    png = image_png(seed=52, size=(150, 64))
    replies = [
        client.chat.completions.create(
            model=family.model_name, messages=image_message(png), max_tokens=4, temperature=0
        )
        for _ in range(2)
    ]
    first, second = replies
    assert first.usage.prompt_tokens > 40  # the image's tokens are in the prompt
    assert second.choices[0].message.content == first.choices[0].message.content
    assert wait_until(lambda: encoded_images(family) >= 1, 10)
    assert encoded_images(family) == 1
    # The whole prompt but its last page comes from the pod's prefix cache.
    cached = second.usage.prompt_tokens_details.cached_tokens
    assert cached >= second.usage.prompt_tokens - 16, (cached, second.usage)


class AddNumbers(BaseModel):
    a: int = Field(ge=0, le=9)
    b: int = Field(ge=0, le=9)


TOOLS = [openai.pydantic_function_tool(AddNumbers)]
ADD = [{"role": "user", "content": "Add."}]


def _mistral_id(call_id: str) -> bool:
    return len(call_id) == 9 and call_id.isalnum()


@pytest.mark.parametrize("family", ["tiny_mistral3_dir"], indirect=True)
def test_mistral3_forced_tool_calls_whole_and_streamed(family):
    """The grammar makes random weights write `[TOOL_CALLS][{...}]` (the marker is a control
    token, kept in the pod's text for the parser); the client gets OpenAI tool calls."""
    client = family.openai_client(max_retries=0)
    named = {"type": "function", "function": {"name": "AddNumbers"}}
    reply = client.chat.completions.parse(
        model=family.model_name, messages=ADD, tools=TOOLS, tool_choice=named,
        temperature=0, max_tokens=60,
    )  # fmt: skip
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls" and not choice.message.content
    [call] = choice.message.tool_calls
    assert _mistral_id(call.id) and call.function.name == "AddNumbers"
    assert isinstance(call.function.parsed_arguments, AddNumbers)
    stream = client.chat.completions.create(
        model=family.model_name, messages=ADD, tools=TOOLS, tool_choice="required",
        parallel_tool_calls=False, temperature=1.0, seed=3, max_tokens=60, stream=True,
    )  # fmt: skip
    calls, content, finish = {}, "", None
    for chunk in stream:
        for streamed in chunk.choices:
            content += streamed.delta.content or ""
            for delta in streamed.delta.tool_calls or []:
                entry = calls.setdefault(delta.index, {"name": "", "arguments": ""})
                entry["id"] = delta.id or entry.get("id")
                entry["name"] += delta.function.name or ""
                entry["arguments"] += delta.function.arguments or ""
            finish = streamed.finish_reason or finish
    assert finish == "tool_calls" and list(calls) == [0] and not content.strip()
    assert calls[0]["name"] == "AddNumbers" and _mistral_id(calls[0]["id"])
    AddNumbers.model_validate_json(calls[0]["arguments"])
