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
    PlainValidator,
    StrictBool,
    StrictFloat,
    StrictInt,
    StrictStr,
)

# Bounds on every list and string a request may carry (docs/api-fields.md). pydantic checks
# a list's length before its items, so an over-long list costs no more than its parse,
# which gateway/middleware.py bounds per route.
MAX_STOP = 16
MAX_STOP_CHARS = 1024
MAX_MESSAGES = 4096
MAX_PARTS = 1024  # content parts of one message
MAX_TOOL_CALLS = 128  # of one earlier assistant message
MAX_PROMPTS = 128  # of one completions request (n x prompts is bounded by max_n after)
MAX_PROMPT_IDS = 1 << 20  # per token-id prompt; the model's context bounds it further
MAX_STOP_TOKEN_IDS = 64
MAX_CHOICES = 256  # guided_choice entries
MAX_CHOICE_CHARS = 1024  # each
MAX_PATTERN_CHARS = 64 * 1024  # guided_regex, guided_grammar


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


def bounded_text(max_length: int, min_length: int = 0):
    """Text of a bounded length (checked before the Unicode check, so the message reads
    "String should have at most N characters")."""
    length = Field(min_length=min_length, max_length=max_length)
    return Annotated[StrictStr, length, AfterValidator(_unicode_text)]


# One stop string: at most MAX_STOP_CHARS (each is copied into every choice's Generate).
StopText = bounded_text(MAX_STOP_CHARS)


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


class VideoURL(_Lenient):
    url: StrictStr = Field(min_length=1)


class VideoPart(_Lenient):
    """vLLM's `video_url` part: one video, served as frame groups on the families that take
    video (docs/design/multimodal.md); on the others the prompt builder refuses it by name."""

    type: Literal["video_url"]
    video_url: VideoURL


class InputAudio(_Lenient):
    data: StrictStr
    format: StrictStr | None = None


class AudioPart(_Lenient):
    """OpenAI's `input_audio` part: accepted by the schema so that the prompt builder can
    refuse it by name (no audio tower is served, Gemma 4's E models' included)."""

    type: Literal["input_audio"]
    input_audio: InputAudio


ContentPart = Annotated[TextPart | ImagePart | VideoPart | AudioPart, Field(discriminator="type")]


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
    content: Text | Annotated[list[ContentPart], Field(max_length=MAX_PARTS)] | None = None
    name: Text | None = None
    tool_calls: Annotated[list[ToolCall], Field(max_length=MAX_TOOL_CALLS)] | None = None
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
    stop: StopText | Annotated[list[StopText], Field(max_length=MAX_STOP)] | None = None
    seed: StrictInt | None = Field(None, ge=0, lt=2**63)
    frequency_penalty: StrictFloat | None = Field(None, ge=-2, le=2)
    presence_penalty: StrictFloat | None = Field(None, ge=-2, le=2)
    repetition_penalty: StrictFloat | None = Field(None, gt=0, le=10)
    stream: StrictBool = False
    stream_options: StreamOptions | None = None
    ignore_eos: StrictBool = False
    user: Text | None = None
    # vLLM's tenant salt (docs/design/security.md): checked by gateway/tenancy.py (a bad value
    # → 400).
    cache_salt: Any = None
    logit_bias: Any = None
    response_format: Any = None  # on /v1/completions an extension
    # vLLM's and SGLang's extensions that Iris honours (docs/api-fields.md).
    stop_token_ids: (
        Annotated[list[Annotated[StrictInt, Field(ge=0)]], Field(max_length=MAX_STOP_TOKEN_IDS)]
        | None
    ) = None
    min_tokens: StrictInt = Field(0, ge=0, le=2**31 - 1)  # <= max_tokens: api/sampling.py
    skip_special_tokens: StrictBool | None = None
    include_stop_str_in_output: StrictBool = False
    # Constraints, one at most with response_format: gateway/api/structured.py.
    guided_json: Any = None
    guided_regex: bounded_text(MAX_PATTERN_CHARS, 1) | None = None
    guided_choice: (
        Annotated[
            list[bounded_text(MAX_CHOICE_CHARS, 1)],
            Field(min_length=1, max_length=MAX_CHOICES),
        ]
        | None
    ) = None
    guided_grammar: bounded_text(MAX_PATTERN_CHARS, 1) | None = None
    structured_outputs: Any = None  # vLLM's newer form: {json | regex | choice | grammar}


class ChatCompletionRequest(_SamplingFields):
    messages: list[ChatMessage] = Field(min_length=1, max_length=MAX_MESSAGES)
    max_completion_tokens: StrictInt | None = Field(None, ge=1)
    logprobs: StrictBool = False
    top_logprobs: StrictInt | None = Field(None, ge=0, le=20)
    # Caller-supplied image hashes (docs/design/multimodal.md): checked by the intake (a wrong
    # type → 400).
    mm_hashes: Any = None
    tools: Any = None
    tool_choice: Any = None
    parallel_tool_calls: Any = None
    # Reasoning models (gateway/api/reasoning.py checks them against the chat template).
    chat_template_kwargs: Any = None
    reasoning_effort: Any = None
    # Undeclared fields are kept (in `model_extra`) rather than dropped, so that the ones
    # Iris cannot honour are refused by name (gateway/api/refused.py keeps their one list).
    model_config = ConfigDict(extra="allow")


TokenIds = Annotated[
    list[Annotated[StrictInt, Field(ge=0)]], Field(min_length=1, max_length=MAX_PROMPT_IDS)
]
# The prompt's shape for /openapi.json (validation is `_prompt`'s).
PromptSchema = (
    Text
    | Annotated[list[Text], Field(min_length=1, max_length=MAX_PROMPTS)]
    | TokenIds
    | Annotated[list[TokenIds], Field(min_length=1, max_length=MAX_PROMPTS)]
)


def _prompt(value: Any) -> str | list[str] | list[int] | list[list[int]]:
    """A completions prompt, checked in one pass that stops at the first error. (A pydantic
    union would validate a long list once per alternative and build an error per item.)"""
    if isinstance(value, str):
        return _unicode_text(value)
    if not isinstance(value, list) or not value:
        raise ValueError("must be a string, a list of strings, token ids, or lists of token ids")
    first = value[0]
    if isinstance(first, str):
        _bounded(value, MAX_PROMPTS, "strings")
        for index, text in enumerate(value):
            if not isinstance(text, str):
                raise ValueError(f"item {index} is not a string like item 0")
            _unicode_text(text)
        return value
    if isinstance(first, list):
        _bounded(value, MAX_PROMPTS, "token-id lists")
        for index, ids in enumerate(value):
            if not isinstance(ids, list):
                raise ValueError(f"item {index} is not a list of token ids like item 0")
            _token_ids(ids, f"item {index}: ")
        return value
    _token_ids(value, "")
    return value


def _bounded(items: list, limit: int, what: str) -> None:
    if len(items) > limit:
        raise ValueError(f"holds {len(items)} {what}, over the limit of {limit}")


def _token_ids(ids: list, where: str) -> None:
    if not ids:
        raise ValueError(f"{where}a token-id list must not be empty")
    _bounded(ids, MAX_PROMPT_IDS, "token ids")
    # type() is int: not bool, not float (strict, like the rest of the schema).
    if not all(type(token) is int for token in ids):
        index = next(i for i, token in enumerate(ids) if type(token) is not int)
        raise ValueError(f"{where}token id {index} is {ids[index]!r:.40}, not an integer")
    if min(ids) < 0:
        index = next(i for i, token in enumerate(ids) if token < 0)
        raise ValueError(f"{where}token id {index} is {ids[index]}, below 0")


class CompletionRequest(_SamplingFields):
    # A text, texts, token ids or lists of them: checked by `_prompt` (one pass, first error).
    prompt: Annotated[Any, PlainValidator(_prompt, json_schema_input_type=PromptSchema)]
    max_tokens: StrictInt | None = Field(16, ge=1)
    logprobs: StrictInt | None = Field(None, ge=0, le=20)
    echo: StrictBool = False
    suffix: Text | None = None
    best_of: StrictInt | None = Field(None, ge=1)
    # As on chat: undeclared fields are kept so that gateway/api/refused.py can refuse them.
    model_config = ConfigDict(extra="allow")
