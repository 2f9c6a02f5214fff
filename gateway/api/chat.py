"""POST /v1/chat/completions."""

from __future__ import annotations

import contextlib
import time

from fastapi import APIRouter, Request

from gateway.api.deps import CallerDep, GatewayDep
from gateway.api.errors import ERROR_RESPONSES
from gateway.api.generation import (
    Answer,
    Choice,
    Job,
    StreamChunks,
    new_request_id,
    respond,
    streamed,
)
from gateway.api.sampling import resolve_max_tokens, sampling_params
from gateway.api.schemas import ChatCompletionRequest
from gateway.api.telemetry import Inference
from gateway.errors import bad_request

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


@router.post("/v1/chat/completions", responses=ERROR_RESPONSES)
async def chat_completions(
    body: ChatCompletionRequest, gateway: GatewayDep, caller: CallerDep, request: Request
):
    """OpenAI chat completions: text and image parts, streamed (SSE) or whole."""
    started = time.perf_counter()
    gateway.check_model(body.model)
    _check(body, gateway.settings.max_n)
    salts = gateway.salts(request.headers.get("authorization"), body.cache_salt)
    inference = Inference(gateway, "chat", body)
    request_id = new_request_id("chatcmpl")
    try:
        with inference.span.use():
            messages = [message.model_dump(exclude_none=True) for message in body.messages]
            prompt = await gateway.prompts.chat(messages, body.mm_hashes, salts)
            gateway.key_limits.charge_prompt_tokens(caller.key_id, prompt.prompt_tokens)
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
                    ),
                )
                for i in range(body.n)
            ]
            # Routed last: a decision opens an in-flight ticket, which start_all now owns.
            jobs[0].decision = gateway.dispatcher.route(prompt)
    except BaseException as err:
        inference.close(err)
        raise
    answer = Answer(
        ("chat.completion", "chat.completion.chunk"),
        [0] * len(jobs),
        choice_body=lambda choice: _choice_body(choice, body.logprobs),
        stream=lambda generations, chunks: _stream(generations, inference, chunks, started),
    )
    return await respond(request, gateway, body, inference, request_id, jobs, started, answer)


def _choice_body(choice: Choice, logprobs: bool) -> dict:
    return {
        "index": choice.index,
        "message": {"role": "assistant", "content": "".join(choice.text)},
        "logprobs": chat_logprobs(choice.logprobs) if logprobs else None,
        "finish_reason": choice.finish_reason or "stop",
    }


async def _stream(generations, inference, stream: StreamChunks, started):
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
            if tokens is not None:
                logprobs = chat_logprobs(tokens.logprobs) if tokens.logprobs else None
                yield stream.chunk([delta(index, {"content": tokens.text}, logprobs)])
            else:
                yield stream.chunk([delta(index, {}, None, choices[index].finish_reason)])
    last = stream.finish(generations, choices, [0] * len(choices), inference)
    if last is not None:
        yield last
