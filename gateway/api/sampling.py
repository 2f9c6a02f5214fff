"""OpenAI sampling fields → iris.common.SamplingParams, with the limits checked."""

from __future__ import annotations

from gateway.errors import bad_request
from iris.proto import common_pb2


def sampling_params(
    request,
    *,
    max_tokens: int,
    logprobs: bool,
    top_logprobs: int,
    choice: int = 0,
    constraint: common_pb2.Constraint | None = None,
    logit_bias: dict[int, float] | None = None,
    reasoning: bool = False,
    keep_special_tokens: bool = False,
) -> common_pb2.SamplingParams:
    """One choice's parameters; with a seed, choice i samples with seed + i (n differ).
    `constraint` and `logit_bias` come checked (gateway/api/structured.py).
    `keep_special_tokens`: the answer is decoded with control tokens whatever the request's
    skip_special_tokens (a tool-call marker that is one must reach the parser)."""
    stop = request.stop
    stops = [stop] if isinstance(stop, str) else list(stop or [])
    if any(not text for text in stops):
        raise bad_request("stop strings must not be empty", "stop")
    check_min_tokens(request.min_tokens, max_tokens)
    params = common_pb2.SamplingParams(
        temperature=1.0 if request.temperature is None else request.temperature,
        top_p=1.0 if request.top_p is None else request.top_p,
        top_k=request.top_k or 0,
        min_p=request.min_p or 0.0,
        repetition_penalty=request.repetition_penalty or 1.0,
        frequency_penalty=request.frequency_penalty or 0.0,
        presence_penalty=request.presence_penalty or 0.0,
        stop=stops,
        max_tokens=max_tokens,
        ignore_eos=request.ignore_eos,
        logprobs=logprobs,
        top_logprobs=top_logprobs,
    )
    params.stop_token_ids.extend(request.stop_token_ids or [])
    params.min_tokens = request.min_tokens
    params.reasoning = reasoning  # the output opens with a thought: constraint after it
    params.include_stop_str_in_output = request.include_stop_str_in_output
    if keep_special_tokens:
        params.skip_special_tokens = False
    elif request.skip_special_tokens is not None:
        params.skip_special_tokens = request.skip_special_tokens
    if request.seed is not None:
        params.seed = (request.seed + choice) % 2**64
    if constraint is not None:
        params.constraint.CopyFrom(constraint)
    if logit_bias:
        params.logit_bias.update(logit_bias)
    return params


def check_min_tokens(min_tokens: int, max_tokens: int) -> None:
    """`min_tokens` must not pass the completion's budget (the pod's engine holds back EOS,
    stop token ids and stop strings until that many tokens)."""
    if min_tokens > max_tokens:
        raise bad_request(
            f"min_tokens = {min_tokens} is above max_tokens = {max_tokens}", "min_tokens"
        )


def check_stop_token_ids(ids, vocab_size: int) -> None:
    """Every stop token id inside the vocabulary."""
    for index, token in enumerate(ids or []):
        if token >= vocab_size:
            raise bad_request(
                f"stop_token_ids[{index}] = {token} is outside the vocabulary [0, {vocab_size})",
                "stop_token_ids",
            )


def resolve_max_tokens(
    requested: int | None, prompt_tokens: int, max_model_len: int, param: str, prompt_param: str
) -> int:
    """The completion budget: the request's, else what the context leaves; 400 if none is.
    `param` names the budget's field, `prompt_param` the prompt's (messages, prompt[i])."""
    room = max_model_len - prompt_tokens
    if room < 1:
        raise bad_request(
            f"{prompt_param} is {prompt_tokens} tokens; the model's context is {max_model_len}",
            prompt_param,
            "context_length_exceeded",
        )
    if requested is None:
        return room
    if requested > room:
        raise bad_request(
            f"{param} = {requested} plus the prompt's {prompt_tokens} tokens exceeds the "
            f"model's context of {max_model_len}",
            param,
            "context_length_exceeded",
        )
    return requested
