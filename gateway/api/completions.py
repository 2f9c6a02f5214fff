"""POST /v1/completions: text or token-id prompts (no images), one or several."""

from __future__ import annotations

import asyncio
import contextlib

from fastapi import APIRouter, Request

from gateway.api.deps import CallerDep, GatewayDep
from gateway.api.errors import ERROR_RESPONSES
from gateway.api.generation import (
    Answer,
    Choice,
    Job,
    StreamChunks,
    check_whole_response,
    close_decisions,
    new_request_id,
    open_request,
    respond,
    streamed,
)
from gateway.api.grammar_limits import GrammarLimits, check_grammar
from gateway.api.refused import refuse_unhonoured
from gateway.api.sampling import check_stop_token_ids, resolve_max_tokens, sampling_params
from gateway.api.schemas import CompletionRequest
from gateway.api.structured import (
    SchemaLimits,
    logit_bias,
    name_constraint_error,
    request_constraint,
)
from gateway.api.telemetry import Inference
from gateway.errors import APIError, bad_request
from gateway.parsing.route import ParsedBodyRoute

router = APIRouter(tags=["completions"], route_class=ParsedBodyRoute)


def completion_logprobs(entries, offset: int = 0) -> dict:
    """Pod TokenLogprobs → the legacy completions `logprobs` object."""
    tokens, token_logprobs, tops, offsets = [], [], [], []
    for entry in entries:
        offsets.append(offset)
        offset += len(entry.token)
        tokens.append(entry.token)
        token_logprobs.append(entry.logprob)
        tops.append({top.token: top.logprob for top in entry.top})
    return {
        "tokens": tokens,
        "token_logprobs": token_logprobs,
        "top_logprobs": tops,
        "text_offset": offsets,
    }


def _prompts(body: CompletionRequest) -> list[str | list[int]]:
    prompt = body.prompt
    if isinstance(prompt, str):
        return [prompt]
    if prompt and isinstance(prompt[0], int):
        return [prompt]
    return list(prompt)


def _check_unsupported(body: CompletionRequest, max_n: int) -> None:
    refuse_unhonoured(body)
    if body.echo:
        raise bad_request("echo is not supported", "echo")
    if body.suffix:
        raise bad_request("suffix is not supported", "suffix")
    if body.best_of is not None and body.best_of != body.n:
        raise bad_request(f"best_of = {body.best_of} must equal n = {body.n}", "best_of")
    if body.n > max_n:
        raise bad_request(f"n = {body.n} is over the limit of {max_n}", "n")


async def _jobs(gateway, body: CompletionRequest, sources, want_logprobs: bool, salts, constraint):
    """One job per (prompt, choice); choice index = prompt index * n + j. Every prompt and
    its sampling params are checked before any is routed: a routing decision opens an
    in-flight ticket, which a later 4xx would leave open. `constraint`: the checked
    response_format (an Iris extension on this endpoint)."""
    bias = logit_bias(body.logit_bias, gateway.prompts.vocab_size)
    check_stop_token_ids(body.stop_token_ids, gateway.prompts.vocab_size)
    jobs, prompt_of_choice, routed = [], [], []
    for p, source in enumerate(sources):
        param = "prompt" if len(sources) == 1 else f"prompt[{p}]"
        prompt = (
            await gateway.prompts.text(source, param, salts)
            if isinstance(source, str)
            else gateway.prompts.tokens(source, param, salts)
        )
        max_tokens = resolve_max_tokens(
            body.max_tokens, prompt.prompt_tokens, gateway.max_model_len(), "max_tokens", param
        )
        for j in range(body.n):
            sampling = sampling_params(
                body,
                max_tokens=max_tokens,
                logprobs=want_logprobs,
                top_logprobs=body.logprobs or 0,
                choice=j,
                constraint=constraint,
                logit_bias=bias,
            )
            jobs.append(Job(len(jobs), prompt, sampling))
            prompt_of_choice.append(p)
        routed.append(jobs[-body.n])  # the prompt's first choice takes its decision
    check_whole_response(jobs, body.stream, gateway.settings.max_response_tokens)
    try:
        for job in routed:
            job.decision = gateway.dispatcher.route(job.prompt)
    except BaseException:
        close_decisions(routed)  # a later prompt found no pod
        raise
    return jobs, prompt_of_choice


@router.post("/v1/completions", responses=ERROR_RESPONSES)
async def completions(
    body: CompletionRequest, gateway: GatewayDep, caller: CallerDep, request: Request
):
    """OpenAI (legacy) completions, streamed (SSE) or whole."""
    started, salts = open_request(gateway, body, request, _check_unsupported)
    sources = _prompts(body)
    if len(sources) * body.n > gateway.settings.max_n:
        raise bad_request(
            f"{len(sources)} prompts x n = {body.n} is over the limit of "
            f"{gateway.settings.max_n} choices",
            "prompt",
        )
    wanted = await asyncio.to_thread(  # off the loop: see chat.py
        request_constraint, body, SchemaLimits.of(gateway.settings)
    )
    constraint = wanted.constraint
    check_grammar(constraint, GrammarLimits.of(gateway.settings), wanted.param)
    inference = Inference(gateway, "text_completion", body)
    want_logprobs = body.logprobs is not None
    request_id = new_request_id("cmpl")
    try:
        with inference.span.use():
            jobs, prompt_of_choice = await _jobs(
                gateway, body, sources, want_logprobs, salts, constraint
            )
            # Every choice is routed and prefilled on its own: each counts its prompt.
            prompt_tokens = sum(job.prompt.prompt_tokens for job in jobs)
            gateway.key_limits.charge_prompt_tokens(caller.key_id, prompt_tokens)
    except BaseException as err:
        inference.close(err)
        raise

    def stream(generations, chunks):
        return _stream(generations, prompt_of_choice, inference, chunks, started)

    def charge(tokens: int) -> None:
        gateway.key_limits.charge_completion_tokens(caller.key_id, tokens)

    answer = Answer(
        ("text_completion", "text_completion"),
        prompt_of_choice,
        choice_body=lambda choice: _choice_body(choice, want_logprobs),
        stream=stream,
    )
    try:
        return await respond(
            request, gateway, body, inference, request_id, jobs, started, answer, charge
        )
    except APIError as err:  # a pod's refusal of the constraint, named after its field
        raise name_constraint_error(err, wanted.param) from None


def _choice_body(choice: Choice, logprobs: bool) -> dict:
    return {
        "index": choice.index,
        "text": "".join(choice.text),
        "logprobs": completion_logprobs(choice.logprobs) if logprobs else None,
        "finish_reason": choice.finish_reason or "stop",
    }


async def _stream(generations, prompt_of_choice, inference, stream: StreamChunks, started):
    def text_choice(index: int, text: str, logprobs=None, finish_reason=None) -> dict:
        return {"index": index, "text": text, "logprobs": logprobs, "finish_reason": finish_reason}

    choices = [Choice(i) for i in range(len(generations))]
    offsets = [0] * len(generations)
    async with contextlib.aclosing(
        streamed(generations, choices, started, inference.span)
    ) as outputs:
        async for index, tokens in outputs:
            if tokens is not None:
                logprobs = None
                if tokens.logprobs:
                    logprobs = completion_logprobs(tokens.logprobs, offsets[index])
                offsets[index] += len(tokens.text)
                yield stream.chunk([text_choice(index, tokens.text, logprobs)])
            else:
                finish_reason = choices[index].finish_reason
                yield stream.chunk([text_choice(index, "", None, finish_reason)])
    last = stream.finish(generations, choices, prompt_of_choice, inference)
    if last is not None:
        yield last
