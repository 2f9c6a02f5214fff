"""`iris up` with the tiny checkpoints of the tiled, row-broken and aspect-ratio VLM
families: an image chat through gateway, encoder, cache and pod processes, then the same
image again, which is served from the pod's prefix cache and the embedding cache (encoded
once); on Mistral 3, forced tool calls in Mistral's `[TOOL_CALLS]` format through the
official openai client; on Gemma 4 (its pod at two tensor-parallel ranks), answers equal
one rank's in process, and a clip overlapping an earlier one by 75 % encodes only its new
frames. One platform per family serves all of that family's checks (started once per
module)."""

from __future__ import annotations

import pytest
from pydantic import BaseModel, Field

from iris.up.processes import wait_until
from tests.e2e.helpers import image_message, image_png
from tests.e2e.test_chat import encoded_images
from tests.fixtures.platform import start_platform

openai = pytest.importorskip("openai")

pytestmark = pytest.mark.slow


@pytest.fixture(
    scope="module", params=["tiny_internvl_dir", "tiny_mistral3_dir", "tiny_gemma4_dir"]
)
def family(request, tmp_path_factory):
    # Gemma 4's pod runs two tensor-parallel ranks: its checks compare with one rank.
    ranks = 2 if request.param == "tiny_gemma4_dir" else 1
    running = start_platform(
        request.getfixturevalue(request.param),
        tmp_path_factory.mktemp(request.param),
        tensor_parallel_size=ranks,
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


def _gemma4_one_rank(model_dir, png: bytes) -> str:
    """The answer of an in-process engine at one rank to `image_message(png)`."""
    import io

    from PIL import Image

    from iris.models import load_adapter
    from llm_svc import LLM
    from llm_svc.engine.sampling_params import SamplingParams

    adapter = load_adapter(model_dir)
    content = [{"type": "image"}, {"type": "text", "text": "Describe the image."}]
    ids = adapter.chat_prompt_ids([{"role": "user", "content": content}])
    image = Image.open(io.BytesIO(png)).convert("RGB")
    llm = LLM(model_dir, dtype="float32")
    out = llm.generate(
        prompt_token_ids=[ids], images=[[image]],
        sampling_params=SamplingParams(temperature=0.0, max_tokens=4), use_tqdm=False,
    )[0]  # fmt: skip
    return adapter.tokenizer().decode(out.token_ids, skip_special_tokens=True)


@pytest.mark.parametrize("family", ["tiny_gemma4_dir"], indirect=True)
def test_gemma4_two_ranks_answer_as_one_and_clips_share_frames(family, tiny_gemma4_dir):
    import base64

    from tests.fixtures.videos import encode_video, source_frames

    client = family.openai_client()
    png = image_png(seed=52, size=(150, 64))
    reply = client.chat.completions.create(
        model=family.model_name, messages=image_message(png), max_tokens=4, temperature=0
    )
    assert reply.choices[0].message.content == _gemma4_one_rank(tiny_gemma4_dir, png)

    def chat(clip: bytes) -> str:
        url = "data:video/x-matroska;base64," + base64.b64encode(clip).decode()
        content = [{"type": "video_url", "video_url": {"url": url}}]
        messages = [{"role": "user", "content": [*content, {"type": "text", "text": "What?"}]}]
        return (
            client.chat.completions.create(
                model=family.model_name, messages=messages, max_tokens=4, temperature=0
            )
            .choices[0]
            .message.content
        )

    # 2 source frames a second, Iris takes 1: 8 frames each, the second clip's first 6 the
    # first's last 6.
    source = source_frames(20, width=64, height=32, seed=48)
    before = encoded_images(family)
    chat(encode_video(source[:16], fps=2))
    assert wait_until(lambda: encoded_images(family) - before >= 8, 10)
    chat(encode_video(source[4:20], fps=2))
    assert wait_until(lambda: encoded_images(family) - before >= 10, 10)
    assert encoded_images(family) - before == 10
