"""Running a request's choices on the pods and gathering or streaming their output.

Shared by chat and completions: start every choice (each accepted before any byte is
sent, so the HTTP status is known), then either collect them into one response or merge
their chunks, tagged with the choice index, into one stream.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse, Response

from gateway import metrics
from gateway.api.streaming import event_stream
from gateway.dispatch import Generation
from gateway.errors import APIError, bad_request
from gateway.intake.prompt import PreparedPrompt
from gateway.routing.router import Decision
from gateway.service import Gateway
from gateway.tenancy import RequestSalts
from llm_svc.proto import llm_pb2


@dataclass
class Choice:
    """What one choice produced, accumulated from the pod's chunks."""

    index: int
    text: list[str] = field(default_factory=list)
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[llm_pb2.TokenLogprob] = field(default_factory=list)
    finish_reason: str | None = None
    usage: llm_pb2.Usage | None = None
    num_tokens: int = 0  # tokens produced (kept even when the tokens themselves are not)


@dataclass
class Job:
    """One choice to run: its prompt, sampling params and (for the first) routing decision."""

    index: int
    prompt: PreparedPrompt
    sampling: object
    decision: Decision | None = None


def new_request_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


async def start_all(
    gateway: Gateway,
    jobs: Sequence[Job],
    request_id: str,
    exclude: frozenset[str] = frozenset(),
) -> list[Generation]:
    """Start every job (on no pod in `exclude`); if one fails, cancel the accepted ones and
    raise its error."""
    tasks = [
        asyncio.create_task(
            gateway.dispatcher.start(
                job.prompt, job.sampling, f"{request_id}-{job.index}", job.decision, exclude
            )
        )
        for job in jobs
    ]
    try:
        return list(await asyncio.gather(*tasks))
    except BaseException:
        # A task cancelled before it ran never reached the code that closes its ticket.
        close_decisions(jobs)
        for task in tasks:
            if not task.done():
                task.cancel()
        for task in tasks:
            if task.done() and not task.cancelled() and task.exception() is None:
                task.result().cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise


def close_decisions(jobs: Sequence[Job]) -> None:
    """Close the in-flight tickets of jobs' routing decisions (a request that will not run;
    closing twice is harmless)."""
    for job in jobs:
        if job.decision is not None:
            job.decision.release()


def cancel_all(generations: Sequence[Generation]) -> None:
    """Stop every generation's work on its pod and close its ticket (idempotent)."""
    for generation in generations:
        generation.cancel()


def closer(generations: Sequence[Generation], inference) -> Callable[[BaseException | None], None]:
    """A stream's `on_close`: stop what is left of the generations (their pod work and
    in-flight tickets), then end the request's telemetry with the error, if any."""

    def close(error: BaseException | None) -> None:
        cancel_all(generations)
        inference.close(error)

    return close


async def merged(
    generations: Sequence[Generation],
) -> AsyncIterator[tuple[int, llm_pb2.GenerateResponse]]:
    """Every generation's messages as (choice index, message), interleaved as they come."""
    if len(generations) == 1:
        try:
            async with contextlib.aclosing(generations[0].responses()) as responses:
                async for message in responses:
                    yield 0, message
        finally:
            generations[0].cancel()  # a no-op once finished; stops the pod's work if not
        return
    queue: asyncio.Queue = asyncio.Queue()
    done = object()

    async def pump(index: int, generation: Generation) -> None:
        try:
            async for message in generation.responses():
                await queue.put((index, message))
        except Exception as err:  # handed to the consumer, which raises it
            await queue.put((index, err))
        finally:
            await queue.put((index, done))

    tasks = [asyncio.create_task(pump(i, g)) for i, g in enumerate(generations)]
    remaining = len(tasks)
    try:
        while remaining:
            index, item = await queue.get()
            if item is done:
                remaining -= 1
            elif isinstance(item, Exception):
                raise item
            else:
                yield index, item
    finally:
        for task in tasks:
            task.cancel()
        for generation in generations:
            generation.cancel()


def apply(choice: Choice, message: llm_pb2.GenerateResponse, keep: bool = True) -> None:
    """Fold one pod message into a choice; without `keep` (a stream, which has sent them)
    only the tokens' count is kept, not the tokens."""
    kind = message.WhichOneof("kind")
    if kind == "tokens":
        choice.num_tokens += len(message.tokens.token_ids)
        if keep:
            choice.text.append(message.tokens.text)
            choice.token_ids.extend(message.tokens.token_ids)
            choice.logprobs.extend(message.tokens.logprobs)
    elif kind == "finished":
        choice.finish_reason = message.finished.finish_reason or "stop"
        choice.usage = message.finished.usage


async def collect(generations: Sequence[Generation]) -> list[Choice]:
    """Run every generation to its end."""
    choices = [Choice(i) for i in range(len(generations))]
    async with contextlib.aclosing(merged(generations)) as messages:
        async for index, message in messages:
            apply(choices[index], message)
    return choices


async def collect_unless_gone(receive, generations: Sequence[Generation]) -> list[Choice]:
    """`collect`, given up if the client disconnects first (`receive` is the request's ASGI
    receive, its body already read): a whole answer nobody waits for must not keep its pods
    generating. Leaving cancels the generations (see `merged`); then a 499 is raised."""
    collecting = asyncio.ensure_future(collect(generations))
    watching = asyncio.ensure_future(_disconnect(receive))
    try:
        await asyncio.wait((collecting, watching), return_when=asyncio.FIRST_COMPLETED)
    finally:
        watching.cancel()
        if not collecting.done():
            collecting.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await collecting
    if collecting.cancelled():
        raise APIError(499, "the client closed the request", code="client_closed")
    return collecting.result()


async def _disconnect(receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


async def streamed(
    generations: Sequence[Generation], choices: Sequence[Choice], started: float, span=None
) -> AsyncIterator[tuple[int, llm_pb2.TokenChunk | None]]:
    """Every generation's output as (choice index, tokens), and (choice index, None) when
    that choice finishes; each message is folded into `choices` first, and the first
    tokens observe the request's TTFT (from `started`, a perf_counter time) and, given the
    request's InferenceSpan `span`, mark it."""
    first_token = True
    async with contextlib.aclosing(merged(generations)) as messages:
        async for index, message in messages:
            apply(choices[index], message, keep=False)
            kind = message.WhichOneof("kind")
            if kind == "tokens":
                if first_token:
                    first_token = False
                    metrics.TTFT_SECONDS.observe(time.perf_counter() - started)
                    if span is not None:
                        span.first_token()
                yield index, message.tokens
            elif kind == "finished":
                yield index, None


@dataclass
class StreamChunks:
    """The envelope every chunk of one streamed response shares (`object` is
    chat.completion.chunk or text_completion)."""

    request_id: str
    object: str
    created: int
    model: str
    include_usage: bool

    def chunk(self, choices: list[dict], usage: dict | None = None) -> dict:
        body = {
            "id": self.request_id,
            "object": self.object,
            "created": self.created,
            "model": self.model,
            "choices": choices,
        }
        if self.include_usage:
            body["usage"] = usage  # null on every chunk but the last, as OpenAI sends it
        return body

    def finish(self, generations, choices, prompts_per_choice, inference) -> dict | None:
        """Record the request's result; the usage chunk that ends the stream, if asked."""
        usage = usage_of(generations, choices, prompts_per_choice)
        finish_reasons = [choice.finish_reason or "stop" for choice in choices]
        inference.result(self.request_id, self.model, finish_reasons, usage)
        return self.chunk([], usage.body()) if self.include_usage else None


@dataclass
class Usage:
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0

    def body(self) -> dict:
        return {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "total_tokens": self.prompt_tokens + self.completion_tokens,
            "prompt_tokens_details": {"cached_tokens": self.cached_tokens},
        }


def usage_of(
    generations: Sequence[Generation], choices: Sequence[Choice], prompts_per_choice: Sequence[int]
) -> Usage:
    """Each distinct prompt counts once (n choices share it); completions add up."""
    usage = Usage()
    seen = set()
    for generation, choice, prompt in zip(generations, choices, prompts_per_choice, strict=True):
        final = choice.usage
        if prompt not in seen:
            seen.add(prompt)
            usage.prompt_tokens += (final.prompt_tokens if final else 0) or (
                generation.accepted.prompt_tokens
            )
            usage.cached_tokens += (final.cached_tokens if final else 0) or (
                generation.accepted.cached_tokens
            )
        usage.completion_tokens += (
            final.completion_tokens if final and final.completion_tokens else choice.num_tokens
        )
    return usage


@dataclass(frozen=True)
class Answer:
    """What differs between chat and completions in an answer: the `object` of the whole
    response and of a stream chunk, the prompt of each choice (for usage), the body of one
    finished choice, and the chunks of a stream (from the generations and the envelope)."""

    objects: tuple[str, str]
    prompts_per_choice: Sequence[int]
    choice_body: Callable[[Choice], dict]
    stream: Callable[[Sequence[Generation], StreamChunks], AsyncIterator[dict]]


def open_request(
    gateway: Gateway, body, request: Request, check: Callable[[Any, int], None]
) -> tuple[float, RequestSalts]:
    """What chat and completions do first, before any prompt is read: start the clock,
    check that the model named is the one served and the endpoint's own `check(body, max_n)`,
    then take the caller's salts (a bad `cache_salt` is a 400). Returns (start, salts)."""
    started = time.perf_counter()
    gateway.check_model(body.model)
    check(body, gateway.settings.max_n)
    return started, gateway.salts(request.headers.get("authorization"), body.cache_salt)


async def respond(
    request: Request,
    gateway: Gateway,
    body,
    inference,
    request_id: str,
    jobs: Sequence[Job],
    started: float,
    answer: Answer,
    charge: Callable[[int], None] | None = None,
) -> Response:
    """Start the jobs (chat and completions alike), then answer: when `body.stream`, an SSE
    stream of `answer.stream`'s chunks; else, once every choice finished, one JSON body.
    `charge(n)` is called with every chunk's tokens as they arrive (the caller's key's
    completion-token bucket). Any failure ends the request's telemetry (`inference`)."""
    try:
        with inference.span.use():
            metrics.OVERHEAD_SECONDS.observe(time.perf_counter() - started)
            generations, choices = await run_once_more_if_a_pod_fails(
                gateway, jobs, request_id, None if body.stream else request.receive, charge
            )
    except BaseException as err:
        inference.close(err)
        raise
    created, model = int(time.time()), gateway.model_name
    headers = pod_header(gateway, generations)
    if body.stream:
        include_usage = bool(body.stream_options and body.stream_options.include_usage)
        envelope = StreamChunks(request_id, answer.objects[1], created, model, include_usage)
        chunks = answer.stream(generations, envelope)
        closing = closer(generations, inference)
        return event_stream(chunks, closing, headers, ending=gateway.streams_ending)
    usage = usage_of(generations, choices, answer.prompts_per_choice)
    inference.result(request_id, model, [c.finish_reason or "stop" for c in choices], usage)
    inference.close()
    return JSONResponse(
        {
            "id": request_id,
            "object": answer.objects[0],
            "created": created,
            "model": model,
            "choices": [answer.choice_body(choice) for choice in choices],
            "usage": usage.body(),
        },
        headers=headers,
    )


def check_whole_response(jobs: Sequence[Job], stream: bool, bound: int) -> None:
    """A whole (non-streamed) response holds every choice's tokens and their top logprobs
    until the last finishes: at most `bound` of them, n x max_tokens x (1 + top_logprobs)
    summed over the choices, else a 400 (a stream keeps nothing it has sent)."""
    if stream:
        return
    held = sum(job.sampling.max_tokens * (1 + job.sampling.top_logprobs) for job in jobs)
    if held > bound:
        raise bad_request(
            f"n x max_tokens x (1 + top_logprobs) = {held} tokens for one whole response is "
            f"over the limit of {bound} (max_response_tokens): lower them, or stream",
            "max_tokens",
            "response_too_large",
        )


async def run_once_more_if_a_pod_fails(
    gateway: Gateway,
    jobs: Sequence[Job],
    request_id: str,
    receive,
    charge: Callable[[int], None] | None = None,
) -> tuple[list[Generation], list[Choice] | None]:
    """Start the jobs, then either collect them (`receive` given: a whole answer) or read
    each choice's first message (a stream: nothing is sent before they are all in). When a
    pod fails before anything of the request has reached the client, every choice starts
    again, once, on pods other than the failed ones. Returns (generations, the collected
    choices or None for a stream). The client's key was charged its prompt at the door,
    once; `charge` is handed every chunk's tokens from the first message on, a failed
    attempt's included (they were computed)."""
    failed: frozenset[str] = frozenset()
    for attempt in (0, 1):
        if attempt:
            jobs = [Job(job.index, job.prompt, job.sampling) for job in jobs]
        generations = await start_all(gateway, jobs, request_id, failed)
        for prompt in {id(job.prompt): job.prompt for job in jobs}.values():
            prompt.release_videos()  # accepted: frames only an encode still running needs
        for generation in generations:
            generation.on_tokens = charge
        try:
            if receive is not None:
                return generations, await collect_unless_gone(receive, generations)
            await _prime_all(generations)
            return generations, None
        except BaseException as err:
            cancel_all(generations)  # a failure, or the client left: no pod works on for it
            broken = frozenset(g.pod.address for g in generations if g.pod_failed)
            if attempt or not broken or not isinstance(err, APIError):
                raise
            failed = broken
            metrics.RETRIES.labels("pod_failed").inc()
    raise AssertionError("unreachable")


async def _prime_all(generations: Sequence[Generation]) -> None:
    """Every generation's first message read (and kept); the first failure raised."""
    tasks = [asyncio.ensure_future(generation.prime()) for generation in generations]
    try:
        await asyncio.gather(*tasks)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def pod_header(gateway: Gateway, generations: Sequence[Generation]) -> dict[str, str]:
    """`X-Iris-Pod`: the address(es) of the pod(s) that served the request — only when the
    gateway's `debug_pod_header` setting is on (clients are not told internal addresses)."""
    if not gateway.settings.debug_pod_header:
        return {}
    return {"X-Iris-Pod": ",".join(sorted({g.pod.address for g in generations}))}
