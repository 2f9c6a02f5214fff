"""A GenAI semantic-convention span per inference (`chat <model>`, `text_completion
<model>`), a child of FastAPI's own HTTP server span; it ends when the last chunk is sent.
It records a `first_token` event when the first tokens reach the client's stream, and the
gateway's own stages are its children (`stage`): bench/stages.py reads them back."""

from __future__ import annotations

from collections.abc import Sequence

from opentelemetry import trace

from gateway.api.generation import Usage
from iris.telemetry import tracer

_tracer = tracer("gateway.genai")


def stage(name: str):
    """A span around one stage of a request in the gateway (`gateway.intake`,
    `gateway.route`, `gateway.encode`), a child of the current span."""
    return _tracer.start_as_current_span(name)


class InferenceSpan:
    """Request attributes at start, response attributes and end at `finish`."""

    def __init__(self, operation: str, body, max_tokens: int | None = None) -> None:
        self.span = _tracer.start_span(f"{operation} {body.model}", kind=trace.SpanKind.INTERNAL)
        attributes = {
            "gen_ai.operation.name": operation,
            "gen_ai.provider.name": "iris",
            "gen_ai.request.model": body.model,
            "gen_ai.request.max_tokens": max_tokens,
            "gen_ai.request.temperature": body.temperature,
            "gen_ai.request.top_p": body.top_p,
            "gen_ai.request.seed": body.seed,
            "gen_ai.request.frequency_penalty": body.frequency_penalty,
            "gen_ai.request.presence_penalty": body.presence_penalty,
            "gen_ai.request.choice.count": body.n,
        }
        for name, value in attributes.items():
            if value is not None:
                self.span.set_attribute(name, value)
        self._ended = False

    def use(self):
        """Make the span current (children: reserve, generate) without ending it."""
        return trace.use_span(self.span, end_on_exit=False)

    def first_token(self) -> None:
        """The first tokens are on their way to the client (the gateway's TTFT)."""
        self.span.add_event("first_token")

    def set_max_tokens(self, max_tokens: int) -> None:
        self.span.set_attribute("gen_ai.request.max_tokens", max_tokens)

    def finish(
        self,
        response_id: str | None = None,
        model: str | None = None,
        finish_reasons: Sequence[str] = (),
        usage: Usage | None = None,
        error: BaseException | None = None,
    ) -> None:
        if self._ended:
            return
        self._ended = True
        span = self.span
        if response_id:
            span.set_attribute("gen_ai.response.id", response_id)
        if model:
            span.set_attribute("gen_ai.response.model", model)
        if finish_reasons:
            span.set_attribute("gen_ai.response.finish_reasons", list(finish_reasons))
        if usage is not None:
            span.set_attribute("gen_ai.usage.input_tokens", usage.prompt_tokens)
            span.set_attribute("gen_ai.usage.output_tokens", usage.completion_tokens)
        if error is not None:
            span.set_attribute("error.type", type(error).__name__)
            span.set_status(trace.StatusCode.ERROR, str(error))
        span.end()


class Inference:
    """One inference's lifetime: an admission slot and a GenAI span, released exactly once
    (when the response is built, or when the stream ends or fails)."""

    def __init__(self, gateway, operation: str, body) -> None:
        gateway.admission.enter()
        self._admission = gateway.admission
        self.span = InferenceSpan(operation, body)
        self._response: dict = {}
        self._closed = False

    def result(self, response_id: str, model: str, finish_reasons, usage: Usage) -> None:
        self._response = dict(
            response_id=response_id, model=model, finish_reasons=finish_reasons, usage=usage
        )

    def close(self, error: BaseException | None = None) -> None:
        if self._closed:
            return
        self._closed = True
        self._admission.leave()
        self.span.finish(error=error, **self._response)
