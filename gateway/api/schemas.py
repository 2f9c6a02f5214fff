"""Request bodies of the OpenAI-compatible API: the fields Iris honours, the ones it refuses
(gateway/api/refused.py: they would change the output), and others accepted and ignored.
`response_format`, `tools`, `tool_choice` and `logit_bias` are taken as plain JSON here and
checked by gateway/api/structured.py and tools.py, so each error names its exact place."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictFloat,
    StrictInt,
    StrictStr,
)

_MAX_STOP = 16


def _unicode_text(text: str) -> str:
    # JSON may carry a lone UTF-16 surrogate ("\ud800"); no tokenizer or proto can take it.
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as err:
        raise ValueError(
            f"text is not valid Unicode: a lone surrogate {text[err.start]!r} at index {err.start}"
        ) from None
    return text


# Text that reaches the tokenizer, the template or the pod: a string of valid Unicode.
Text = Annotated[StrictStr, AfterValidator(_unicode_text)]


class _Lenient(BaseModel):
    # Clients send fields Iris does not use (user, metadata, ...): accept and ignore them.
    model_config = ConfigDict(extra="ignore")


class TextPart(_Lenient):
    type: Literal["text"]
    text: Text


class ImageURL(_Lenient):
    url: StrictStr = Field(min_length=1)
    detail: Literal["auto", "low", "high"] | None = None


class ImagePart(_Lenient):
    type: Literal["image_url"]
    image_url: ImageURL


ContentPart = Annotated[TextPart | ImagePart, Field(discriminator="type")]


class ToolCallFunction(_Lenient):
    name: Text
    arguments: Text = "{}"


class ToolCall(_Lenient):
    """A call an earlier assistant turn made (sent back in the conversation)."""

    id: Text | None = None
    type: Literal["function"] = "function"
    function: ToolCallFunction


class ChatMessage(_Lenient):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: Text | list[ContentPart] | None = None
    name: Text | None = None
    tool_calls: Annotated[list[ToolCall], Field(max_length=128)] | None = None
    tool_call_id: Text | None = None


class StreamOptions(_Lenient):
    include_usage: StrictBool = False


class _SamplingFields(_Lenient):
    model: StrictStr
    n: StrictInt = Field(1, ge=1, le=128)
    max_tokens: StrictInt | None = Field(None, ge=1)
    temperature: StrictFloat | None = Field(None, ge=0, le=2)
    top_p: StrictFloat | None = Field(None, gt=0, le=1)
    top_k: StrictInt | None = Field(None, ge=-1, le=2**31 - 1)  # int32 on the wire
    min_p: StrictFloat | None = Field(None, ge=0, le=1)  # vLLM's and SGLang's extension
    stop: Text | Annotated[list[Text], Field(max_length=_MAX_STOP)] | None = None
    seed: StrictInt | None = Field(None, ge=0, lt=2**63)
    frequency_penalty: StrictFloat | None = Field(None, ge=-2, le=2)
    presence_penalty: StrictFloat | None = Field(None, ge=-2, le=2)
    repetition_penalty: StrictFloat | None = Field(None, gt=0, le=10)
    stream: StrictBool = False
    stream_options: StreamOptions | None = None
    ignore_eos: StrictBool = False
    user: Text | None = None
    # vLLM's tenant salt (docs/design.md §2): checked by gateway/tenancy.py (a bad value → 400).
    cache_salt: Any = None
    logit_bias: Any = None
    response_format: Any = None  # on /v1/completions an extension


class ChatCompletionRequest(_SamplingFields):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: StrictInt | None = Field(None, ge=1)
    logprobs: StrictBool = False
    top_logprobs: StrictInt | None = Field(None, ge=0, le=20)
    # Caller-supplied image hashes (docs/design.md §2): checked by the intake (a wrong type → 400).
    mm_hashes: Any = None
    tools: Any = None
    tool_choice: Any = None
    parallel_tool_calls: Any = None
    # Undeclared fields are kept (in `model_extra`) rather than dropped, so that the ones
    # Iris cannot honour are refused by name (gateway/api/refused.py keeps their one list).
    model_config = ConfigDict(extra="allow")


TokenIds = Annotated[list[Annotated[StrictInt, Field(ge=0)]], Field(min_length=1)]


class CompletionRequest(_SamplingFields):
    prompt: (
        Text
        | Annotated[list[Text], Field(min_length=1)]
        | TokenIds
        | Annotated[list[TokenIds], Field(min_length=1)]
    )
    max_tokens: StrictInt | None = Field(16, ge=1)
    logprobs: StrictInt | None = Field(None, ge=0, le=20)
    echo: StrictBool = False
    suffix: Text | None = None
    best_of: StrictInt | None = Field(None, ge=1)
