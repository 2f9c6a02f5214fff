"""Reasoning models: `chat_template_kwargs.enable_thinking` and `reasoning_effort` in, the
thought out as `reasoning_content` (docs/api-fields.md).

Whether a model thinks, and which fields its chat template takes, is the adapter's probe of
the model's own tokenizer and template (iris.models.reasoning). A thinking request's output
is a thought up to the model's end-of-thought marker, then the answer; the pod starts a
request's grammar only after that marker (SamplingParams.reasoning), so a JSON schema or a
tool call shapes the answer, never the thought.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from gateway.errors import bad_request
from iris.models.reasoning import ReasoningSupport, ThinkMarkers

EFFORTS = ("minimal", "low", "medium", "high")


@dataclass(frozen=True)
class Thinking:
    """What one chat request asks of the template, and whether its output opens with a
    thought (then `markers` split it from the answer)."""

    template_kwargs: dict = field(default_factory=dict)
    thinks: bool = False
    markers: ThinkMarkers | None = None


def resolve_thinking(
    template_kwargs: object, effort: object, support: ReasoningSupport | None
) -> Thinking:
    """Check the request's reasoning fields against what the model's template takes; a 400
    names the field and why. A model that does not think takes `enable_thinking: false`
    (nothing to turn off) and refuses `enable_thinking: true` and `reasoning_effort`."""
    enable = _enable_thinking(template_kwargs)
    if effort is not None and effort not in EFFORTS:
        raise bad_request(
            f"reasoning_effort = {str(effort)[:40]!r} is not one of {', '.join(EFFORTS)}",
            "reasoning_effort",
        )
    if support is None:
        if enable:
            raise bad_request(
                "this model does not think: chat_template_kwargs.enable_thinking = true "
                "is not supported",
                "chat_template_kwargs.enable_thinking",
                "unsupported_parameter",
            )
        if effort is not None:
            raise bad_request(
                "this model does not think: reasoning_effort is not supported",
                "reasoning_effort",
                "unsupported_parameter",
            )
        return Thinking()
    kwargs = {}
    if enable is not None:
        if not support.takes_enable_thinking:
            raise bad_request(
                "this model's chat template does not take enable_thinking",
                "chat_template_kwargs.enable_thinking",
                "unsupported_parameter",
            )
        kwargs["enable_thinking"] = enable
    if effort is not None:
        if not support.takes_reasoning_effort:
            raise bad_request(
                "this model's chat template does not take reasoning_effort",
                "reasoning_effort",
                "unsupported_parameter",
            )
        kwargs["reasoning_effort"] = effort
    thinks = support.thinks_by_default if enable is None else enable
    return Thinking(kwargs, thinks, support.markers)


def _enable_thinking(template_kwargs: object) -> bool | None:
    if template_kwargs is None:
        return None
    if not isinstance(template_kwargs, dict):
        raise bad_request("chat_template_kwargs must be an object", "chat_template_kwargs")
    for name in template_kwargs:
        if name != "enable_thinking":
            shown = str(name)[:60]
            raise bad_request(
                f"chat_template_kwargs.{shown} is not supported: only enable_thinking is",
                f"chat_template_kwargs.{shown}",
                "unsupported_parameter",
            )
    enable = template_kwargs.get("enable_thinking")
    if enable is not None and not isinstance(enable, bool):
        raise bad_request(
            f"chat_template_kwargs.enable_thinking must be true or false, got {str(enable)[:40]}",
            "chat_template_kwargs.enable_thinking",
        )
    return enable


class ThoughtSplitter:
    """Splits a thinking request's output, as it streams, into `reasoning_content` and
    `content` pieces: everything before the end marker is the thought (a start marker the
    model writes first is dropped), everything after it the answer. A marker cut across
    two chunks is held back until it is whole or ruled out."""

    def __init__(self, markers: ThinkMarkers) -> None:
        self.markers = markers
        self.thinking = True
        self._opened = False  # whether the leading start marker is settled
        self._held = ""

    def feed(self, text: str) -> list[dict]:
        if not self.thinking:
            return [{"content": text}] if text else []
        text = self._held + text
        self._held = ""
        start, end = self.markers.start, self.markers.end
        if not self._opened:
            stripped = text.lstrip()
            if len(stripped) < len(start) and start.startswith(stripped):
                self._held = text  # may still become the start marker
                return []
            if stripped.startswith(start):
                text = stripped[len(start) :]
            self._opened = True
        cut = text.find(end)
        if cut >= 0:
            self.thinking = False
            pieces = [{"reasoning_content": text[:cut]}] if cut else []
            answer = text[cut + len(end) :]
            return pieces + ([{"content": answer}] if answer else [])
        keep = _partial_suffix(text, end)
        self._held = text[len(text) - keep :]
        thought = text[: len(text) - keep]
        return [{"reasoning_content": thought}] if thought else []

    def close(self) -> list[dict]:
        """What is still held back (the output ended): the rest of the thought."""
        held, self._held = self._held, ""
        if not held:
            return []
        return [{"reasoning_content" if self.thinking else "content": held}]


def _partial_suffix(text: str, marker: str) -> int:
    """The length of the longest end of `text` that begins `marker` (shorter than it)."""
    for size in range(min(len(marker) - 1, len(text)), 0, -1):
        if marker.startswith(text[-size:]):
            return size
    return 0


def split_thought(text: str, markers: ThinkMarkers) -> tuple[str | None, str | None]:
    """(reasoning_content, content) of a whole answer; None where a part is empty (a thought
    cut by max_tokens leaves no content)."""
    splitter = ThoughtSplitter(markers)
    pieces = splitter.feed(text) + splitter.close()
    reasoning = "".join(piece.get("reasoning_content", "") for piece in pieces)
    content = "".join(piece.get("content", "") for piece in pieces)
    return reasoning or None, content or None
