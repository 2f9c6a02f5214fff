"""POST /v1/chat/completions."""

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
    new_request_id,
    open_request,
    respond,
    streamed,
)
from gateway.api.grammar_limits import GrammarLimits, check_grammar
from gateway.api.reasoning import Thinking, ThoughtSplitter, resolve_thinking, split_thought
from gateway.api.refused import refuse_unhonoured
from gateway.api.sampling import check_stop_token_ids, resolve_max_tokens, sampling_params
from gateway.api.schemas import ChatCompletionRequest
from gateway.api.structured import SchemaLimits, logit_bias, name_constraint_error
from gateway.api.telemetry import Inference, stage
from gateway.api.tool_calls import parse_answer, tool_call_stream
from gateway.api.tools import OutputPlan, plan_chat_output
from gateway.errors import APIError, bad_request
from gateway.parsing.route import ParsedBodyRoute

router = APIRouter(tags=["chat"], route_class=ParsedBodyRoute)


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


def _dumped(messages) -> list[dict]:
    return [message.model_dump(exclude_none=True) for message in messages]


def _plan(body: ChatCompletionRequest, gateway) -> OutputPlan:
    limits = SchemaLimits.of(gateway.settings)
    fmt = gateway.prompts.adapter.tool_call_format
    plan = plan_chat_output(body, limits, gateway.settings.max_tools, fmt)
    # Every constraint a chat request makes passes here, before any pod compiles it.
    check_grammar(plan.constraint, GrammarLimits.of(gateway.settings), plan.constraint_param)
    return plan


@router.post("/v1/chat/completions", responses=ERROR_RESPONSES)
async def chat_completions(
    body: ChatCompletionRequest, gateway: GatewayDep, caller: CallerDep, request: Request
):
    """OpenAI chat completions: text and image parts, streamed (SSE) or whole."""
    started, salts = open_request(gateway, body, request, _check)
    # Meta-validating schemas is pure Python (0.5 s for a large one): on a thread, where
    # the interpreter hands the loop the GIL every switch interval.
    plan = await asyncio.to_thread(_plan, body, gateway)
    thinking = resolve_thinking(
        body.chat_template_kwargs, body.reasoning_effort, gateway.prompts.adapter.reasoning
    )
    bias = logit_bias(body.logit_bias, gateway.prompts.vocab_size)
    check_stop_token_ids(body.stop_token_ids, gateway.prompts.vocab_size)
    fmt = gateway.prompts.adapter.tool_call_format
    inference = Inference(gateway, "chat", body)
    request_id = new_request_id("chatcmpl")
    try:
        with inference.span.use():
            # Thousands of messages take milliseconds to dump: off the loop too.
            messages = await asyncio.to_thread(_dumped, body.messages)
            taken = 0

            def take(tokens: int) -> None:  # videos' planned tokens, before their decode
                nonlocal taken
                gateway.key_limits.take_prompt_tokens(caller.key_id, tokens * body.n)
                taken += tokens * body.n

            try:
                with stage("gateway.intake"):
                    prompt = await gateway.prompts.chat(
                        messages, body.mm_hashes, salts, plan.tools, thinking.template_kwargs, take
                    )
            except APIError as err:
                if err.status == 503 and taken:
                    # The decode never ran (the bytes in flight stayed full) or its worker
                    # died: the key gets back what it paid ahead for it.
                    gateway.key_limits.charge_prompt_tokens(caller.key_id, -taken)
                raise
            # Each of the n choices is routed and prefilled on its own: n x the prompt,
            # settled against what the videos took before their decode.
            charged = prompt.prompt_tokens * body.n - taken
            gateway.key_limits.charge_prompt_tokens(caller.key_id, charged)
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
                        reasoning=thinking.thinks,
                        keep_special_tokens=plan.parse_tools and fmt.marker_is_control,
                    ),
                )
                for i in range(body.n)
            ]
            check_whole_response(jobs, body.stream, gateway.settings.max_response_tokens)
            # Routed last: a decision opens an in-flight ticket, which start_all now owns.
            with stage("gateway.route"):
                jobs[0].decision = gateway.dispatcher.route(prompt)
    except BaseException as err:
        inference.close(err)
        raise

    def stream(generations, chunks):
        parsers = [
            tool_call_stream(fmt, plan.tool_names, plan.tool_parameters)
            if plan.parse_tools
            else None
            for _ in generations
        ]
        splitters = [
            ThoughtSplitter(thinking.markers) if thinking.thinks else None for _ in generations
        ]
        return _stream(generations, inference, chunks, started, parsers, splitters)

    def charge(tokens: int) -> None:
        gateway.key_limits.charge_completion_tokens(caller.key_id, tokens)

    answer = Answer(
        ("chat.completion", "chat.completion.chunk"),
        [0] * len(jobs),
        choice_body=lambda choice: _choice_body(choice, body.logprobs, plan, fmt, thinking),
        stream=stream,
    )
    try:
        return await respond(
            request, gateway, body, inference, request_id, jobs, started, answer, charge
        )
    except APIError as err:  # a pod's refusal of the constraint, named after its field
        raise name_constraint_error(err, plan.constraint_param) from None


def _choice_body(choice: Choice, logprobs: bool, plan: OutputPlan, fmt, thinking: Thinking) -> dict:
    message = {"role": "assistant", "content": "".join(choice.text)}
    finish_reason = choice.finish_reason or "stop"
    if thinking.thinks:
        reasoning, message["content"] = split_thought(message["content"], thinking.markers)
        message["reasoning_content"] = reasoning
    if plan.parse_tools and message["content"] is not None:
        content, calls = parse_answer(
            message["content"], fmt, plan.tool_names, plan.tool_parameters
        )
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


async def _stream(generations, inference, stream: StreamChunks, started, parsers, splitters):
    def delta(index: int, content: dict, logprobs=None, finish_reason=None) -> dict:
        return {
            "index": index,
            "delta": content,
            "logprobs": logprobs,
            "finish_reason": finish_reason,
        }

    def pieces_of(index: int, text: str, closing: bool = False) -> list[dict]:
        """The deltas one chunk of text makes: the thought first (a thinking request), then
        the answer through the tool-call parser (when tools are parsed)."""
        splitter, parser = splitters[index], parsers[index]
        if splitter is None:
            split = [] if closing else [{"content": text}]
        else:
            split = splitter.close() if closing else splitter.feed(text)
        pieces = []
        for piece in split:
            if "content" in piece and parser is not None:
                pieces.extend(parser.feed(piece["content"]))
            else:
                pieces.append(piece)
        if closing and parser is not None:
            pieces.extend(parser.close())
        return pieces

    choices = [Choice(i) for i in range(len(generations))]
    for choice in choices:
        yield stream.chunk([delta(choice.index, {"role": "assistant", "content": ""})])
    async with contextlib.aclosing(
        streamed(generations, choices, started, inference.span)
    ) as outputs:
        async for index, tokens in outputs:
            parser = parsers[index]
            if tokens is not None:
                logprobs = chat_logprobs(tokens.logprobs) if tokens.logprobs else None
                pieces = pieces_of(index, tokens.text)
                if logprobs and not pieces:
                    pieces = [{"content": ""}]  # the logprobs still go out
                for piece in pieces:
                    yield stream.chunk([delta(index, piece, logprobs)])
                    logprobs = None
                continue
            reason = choices[index].finish_reason
            for piece in pieces_of(index, "", closing=True):
                yield stream.chunk([delta(index, piece)])
            if parser is not None and parser.calls:
                reason = choices[index].finish_reason = _tool_finish(reason or "stop")
            yield stream.chunk([delta(index, {}, None, reason)])
    last = stream.finish(generations, choices, [0] * len(choices), inference)
    if last is not None:
        yield last
