"""Fields a request carries beyond what its schema declares: each is either known to change
nothing about the output (accepted and ignored), or refused with a 400 naming it. A field
that would change the output is never silently dropped; an unknown field is refused too
(as OpenAI does), since Iris cannot know it changes nothing. docs/api-fields.md keeps the
one table of every field."""

from __future__ import annotations

from pydantic import BaseModel

from gateway.errors import bad_request

# Accepted and ignored: they do not change what the model returns.
IGNORED = frozenset(
    {
        "user",
        "metadata",
        "store",
        "service_tier",
        "prompt_cache_key",
        "safety_identifier",
        "request_id",
        "priority",
        "guided_decoding_backend",  # Iris has one grammar backend (xgrammar)
    }
)

# Would change the output and are not honoured: why, for the 400.
REFUSED = {
    "audio": "audio output is not supported",
    "prediction": "predicted outputs are not supported",
    "web_search_options": "web search is not supported",
    "functions": "the deprecated `functions` is not supported: use `tools`",
    "function_call": "the deprecated `function_call` is not supported: use `tool_choice`",
    # Chat declares these two (a thinking model's template takes them); elsewhere refused.
    "reasoning_effort": "reasoning_effort is a chat completions field",
    "verbosity": "verbosity is not supported",
    "use_beam_search": "beam search is not supported",
    "best_of": "best_of is not supported on chat",
    "echo": "echo is not supported",
    "length_penalty": "length_penalty (beam search) is not supported",
    "early_stopping": "early_stopping (beam search) is not supported",
    "prompt_logprobs": "prompt_logprobs is not supported",
    "truncate_prompt_tokens": "truncating the prompt is not supported: send a shorter one",
    "allowed_token_ids": "allowed_token_ids is not supported: use logit_bias or a constraint",
    "bad_words": "bad_words is not supported: use logit_bias",
    "guided_whitespace_pattern": "guided_whitespace_pattern is not supported",
    "spaces_between_special_tokens": "spaces_between_special_tokens is not supported",
    "logits_processors": "logits_processors is not supported",
    "return_tokens_as_token_ids": "return_tokens_as_token_ids is not supported",
    "chat_template": "a request's own chat_template is not supported",
    "chat_template_kwargs": "chat_template_kwargs is a chat completions field",
    "documents": "documents is not supported",
    "mm_processor_kwargs": "mm_processor_kwargs is not supported",
    "continue_final_message": "continue_final_message is not supported",
    "add_generation_prompt": "add_generation_prompt is not supported (always true)",
    "add_special_tokens": "add_special_tokens is not supported",
    "structural_tag": "structural_tag is not supported: use tools or guided_grammar",
    "thinking": "thinking is not supported: use chat_template_kwargs.enable_thinking",
    "enable_thinking": "use chat_template_kwargs.enable_thinking, not a top-level field",
    "top_a": "top_a is not supported",
    "typical_p": "typical_p is not supported",
    "tfs": "tfs is not supported",
    "mirostat": "mirostat is not supported",
    "dynatemp_range": "dynamic temperature is not supported",
    "n_probs": "n_probs is not supported: use logprobs",
    "image_detail": "image_detail is not supported",
    "lora_request": "LoRA adapters are not supported",
    "kv_transfer_params": "kv_transfer_params is not supported",
    "vllm_xargs": "vllm_xargs is not supported",
}


def refuse_unhonoured(body: BaseModel) -> None:
    """A 400 for the first undeclared field set that Iris does not honour (declared fields
    are the schema's; undeclared ones are what it kept in `model_extra`)."""
    extra = body.model_extra or {}
    modalities = extra.get("modalities")
    if modalities is not None and modalities != ["text"]:
        raise bad_request(
            f"modalities = {str(modalities)[:60]} is not supported: only ['text'] output",
            "modalities",
            "unsupported_parameter",
        )
    for name, value in extra.items():
        if name in IGNORED or name == "modalities":
            continue
        why = REFUSED.get(name)
        if why is not None:
            if value is None:
                continue  # null is the field's default: nothing asked
            raise bad_request(f"{name}: {why}", name, "unsupported_parameter")
        shown = name if len(name) <= 60 else name[:60] + "..."
        raise bad_request(
            f"unrecognized request field {shown!r}: Iris does not know what it would change, "
            "so it refuses it (docs/api-fields.md lists every field)",
            shown,
            "unknown_parameter",
        )
