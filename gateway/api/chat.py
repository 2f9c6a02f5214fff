"""POST /v1/chat/completions."""

from __future__ import annotations

import contextlib
import time

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from gateway import metrics
from gateway.api.deps import Authorized, GatewayDep
from gateway.api.errors import ERROR_RESPONSES
from gateway.api.generation import (
    Choice,
    Job,
    StreamChunks,
    closer,
    collect_unless_gone,
    new_request_id,
    start_all,
    streamed,
    usage_of,
)
from gateway.api.generation import (
    pod_header as _pod_header,
)
from gateway.api.refused import refuse_unhonoured
from gateway.api.sampling import resolve_max_tokens, sampling_params
from gateway.api.schemas import ChatCompletionRequest
from gateway.api.streaming import event_stream
from gateway.api.structured import SchemaLimits, logit_bias, name_constraint_error
from gateway.api.telemetry import Inference
from gateway.api.tool_calls import ToolCallStream, parse_answer
from gateway.api.tools import OutputPlan, plan_chat_output
from gateway.errors import APIError, bad_request

router = APIRouter(tags=["chat"])


def _logprob_entry(token: str, logprob: float) -> dict:
    return {"token": token, "logprob": logprob, "bytes": list(token.encode())}


def chat_logprobs(entries) -> dict:
    """Pod TokenLogprobs → OpenAI chat `logprobs.content`."""
    return {
        "content": [
            {
                **_logprob_entry(entry.token, entry.logprob),
                "top_logprobs": [_logprob_entry(top.token, top.logprob) for top in entry.top],
            }
            for entry in entries
        ]
    }


def _check(body: ChatCompletionRequest, max_n: int) -> None:
    if body.n > max_n:
        raise bad_request(f"n = {body.n} is over the limit of {max_n}", "n")
    if body.top_logprobs and not body.logprobs:
        raise bad_request("top_logprobs needs logprobs: true", "top_logprobs")
    refuse_unhonoured(body)


def _plan(body: ChatCompletionRequest, gateway) -> OutputPlan:
    settings = gateway.settings
    limits = SchemaLimits(settings.max_schema_bytes, settings.max_schema_depth)
    fmt = gateway.prompts.adapter.tool_call_format
    return plan_chat_output(body, limits, settings.max_tools, fmt)


@router.post("/v1/chat/completions", responses=ERROR_RESPONSES, dependencies=[Authorized])
async def chat_completions(body: ChatCompletionRequest, gateway: GatewayDep, request: Request):
    """OpenAI chat completions: text and image parts, streamed (SSE) or whole."""
    started = time.perf_counter()
    gateway.check_model(body.model)
    _check(body, gateway.settings.max_n)
    plan = _plan(body, gateway)
    bias = logit_bias(body.logit_bias, gateway.prompts.vocab_size)
    fmt = gateway.prompts.adapter.tool_call_format
    inference = Inference(gateway, "chat", body)
    request_id = new_request_id("chatcmpl")
    try:
        with inference.span.use():
            messages = [message.model_dump(exclude_none=True) for message in body.messages]
            prompt = await gateway.prompts.chat(messages, body.mm_hashes, plan.tools)
            requested = body.max_completion_tokens or body.max_tokens
            param = "max_completion_tokens" if body.max_completion_tokens else "max_tokens"
            max_tokens = resolve_max_tokens(
                requested, prompt.prompt_tokens, gateway.max_model_len(), param, "messages"
            )
            inference.span.set_max_tokens(max_tokens)
            jobs = [
                Job(
                    i,
                    prompt,
                    sampling_params(
                        body,
                        max_tokens=max_tokens,
                        logprobs=body.logprobs,
                        top_logprobs=body.top_logprobs or 0,
                        choice=i,
                        constraint=plan.constraint,
                        logit_bias=bias,
                    ),
                )
                for i in range(body.n)
            ]
            # Routed last: a decision opens an in-flight ticket, which start_all now owns.
            jobs[0].decision = gateway.dispatcher.route(prompt)
            metrics.OVERHEAD_SECONDS.observe(time.perf_counter() - started)
            try:
                generations = await start_all(gateway, jobs, request_id)
            except APIError as err:
                raise name_constraint_error(err, plan.constraint_param) from None
    except BaseException as err:
        inference.close(err)
        raise
    created, model = int(time.time()), gateway.model_name
    if body.stream:
        include_usage = bool(body.stream_options and body.stream_options.include_usage)
        stream = StreamChunks(request_id, "chat.completion.chunk", created, model, include_usage)
        parsers = [
            ToolCallStream(fmt, plan.tool_names) if plan.parse_tools else None for _ in generations
        ]
        chunks = _stream(generations, inference, stream, started, parsers)
        return event_stream(
            chunks,
            closer(generations, inference),
            _pod_header(generations),
            ending=gateway.streams_ending,
        )
    try:
        choices = await collect_unless_gone(request.receive, generations)
    except BaseException as err:
        inference.close(err)
        raise
    bodies = [_choice_body(choice, body.logprobs, plan, fmt) for choice in choices]
    usage = usage_of(generations, choices, [0] * len(choices))
    inference.result(request_id, model, [b["finish_reason"] for b in bodies], usage)
    inference.close()
    return JSONResponse(
        {
            "id": request_id,
            "object": "chat.completion",
            "created": created,
            "model": model,
            "choices": bodies,
            "usage": usage.body(),
        },
        headers=_pod_header(generations),
    )


def _choice_body(choice: Choice, logprobs: bool, plan: OutputPlan, fmt) -> dict:
    message = {"role": "assistant", "content": "".join(choice.text)}
    finish_reason = choice.finish_reason or "stop"
    if plan.parse_tools:
        content, calls = parse_answer(message["content"], fmt, plan.tool_names)
        message["content"] = content
        if calls:
            message["tool_calls"] = calls
            finish_reason = _tool_finish(finish_reason)
    return {
        "index": choice.index,
        "message": message,
        "logprobs": chat_logprobs(choice.logprobs) if logprobs else None,
        "finish_reason": finish_reason,
    }


def _tool_finish(reason: str) -> str:
    """A choice that called tools and ended by itself finishes with "tool_calls"."""
    return "tool_calls" if reason == "stop" else reason


async def _stream(generations, inference, stream: StreamChunks, started, parsers):
    def delta(index: int, content: dict, logprobs=None, finish_reason=None) -> dict:
        return {
            "index": index,
            "delta": content,
            "logprobs": logprobs,
            "finish_reason": finish_reason,
        }

    choices = [Choice(i) for i in range(len(generations))]
    for choice in choices:
        yield stream.chunk([delta(choice.index, {"role": "assistant", "content": ""})])
    async with contextlib.aclosing(streamed(generations, choices, started)) as outputs:
        async for index, tokens in outputs:
            parser = parsers[index]
            if tokens is not None:
                logprobs = chat_logprobs(tokens.logprobs) if tokens.logprobs else None
                if parser is None:
                    yield stream.chunk([delta(index, {"content": tokens.text}, logprobs)])
                    continue
                pieces = parser.feed(tokens.text)
                if logprobs and not pieces:
                    pieces = [{"content": ""}]  # the logprobs still go out
                for piece in pieces:
                    yield stream.chunk([delta(index, piece, logprobs)])
                    logprobs = None
                continue
            reason = choices[index].finish_reason
            if parser is not None:
                for piece in parser.close():
                    yield stream.chunk([delta(index, piece)])
                if parser.calls:
                    reason = choices[index].finish_reason = _tool_finish(reason or "stop")
            yield stream.chunk([delta(index, {}, None, reason)])
    last = stream.finish(generations, choices, [0] * len(choices), inference)
    if last is not None:
        yield last
