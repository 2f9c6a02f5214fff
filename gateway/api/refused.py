"""OpenAI fields that would change what the model returns and that Iris does not honour:
each is a 400 naming it, never silently dropped. Fields that change nothing about the
output (user, metadata, store, service_tier, ...) are accepted and ignored; docs/api-fields.md keeps
the table."""

from __future__ import annotations

from pydantic import BaseModel

from gateway.errors import bad_request

CHAT_REFUSED = {
    "audio": "audio output is not supported",
    "prediction": "predicted outputs are not supported",
    "web_search_options": "web search is not supported",
    "functions": "the deprecated `functions` is not supported: use `tools`",
    "function_call": "the deprecated `function_call` is not supported: use `tool_choice`",
    "reasoning_effort": "this model does not reason: reasoning_effort is not supported",
    "verbosity": "verbosity is not supported",
}


def refuse_unhonoured(body: BaseModel) -> None:
    """A 400 for the first field set that Iris would otherwise ignore. The fields are not
    declared by the request's schema: they are read from what it kept undeclared."""
    extra = body.model_extra or {}
    for name, why in CHAT_REFUSED.items():
        if extra.get(name) is not None:
            raise bad_request(f"{name}: {why}", name, "unsupported_parameter")
    modalities = extra.get("modalities")
    if modalities is not None and modalities != ["text"]:
        raise bad_request(
            f"modalities = {modalities!r} is not supported: only ['text'] output",
            "modalities",
            "unsupported_parameter",
        )
