"""Whether a model thinks before it answers, learnt from its own tokenizer and chat template.

A reasoning model (Qwen3 and its kin) writes a thought between two markers, `<think>` and
`</think>`, each one token of its vocabulary, before the answer. Both the gateway (to split
the thought from the answer, and to render the template with `enable_thinking`) and the pod
(to start a grammar only after the end-of-thought token) read the markers from here, so
neither hard-codes an id: a model whose tokenizer lacks them, or whose chat template never
writes them, does not think.
"""

from __future__ import annotations

from dataclasses import dataclass

# The convention of every thinking family served (Qwen3, DeepSeek-R1 distills, QwQ).
THINK_START = "<think>"
THINK_END = "</think>"


@dataclass(frozen=True)
class ThinkMarkers:
    """The thought's markers as text and as the model's token ids."""

    start: str
    end: str
    start_id: int
    end_id: int


def think_markers(tokenizer, chat_template: str | None = None) -> ThinkMarkers | None:
    """The markers when `tokenizer` holds each as one added token and its chat template
    (given, or the tokenizer's own) writes the end marker; else None (the model does not
    think)."""
    template = chat_template if chat_template is not None else tokenizer.chat_template
    if not isinstance(template, str) or THINK_END not in template:
        return None
    added = tokenizer.get_added_vocab()
    if THINK_START not in added or THINK_END not in added:
        return None
    return ThinkMarkers(THINK_START, THINK_END, added[THINK_START], added[THINK_END])


@dataclass(frozen=True)
class ReasoningSupport:
    """What a thinking model's chat template does with the reasoning fields: whether it
    takes `enable_thinking` (and thinks when not told), and whether it takes
    `reasoning_effort` (its rendering changes with the value)."""

    markers: ThinkMarkers
    takes_enable_thinking: bool
    thinks_by_default: bool
    takes_reasoning_effort: bool


def probe_reasoning(tokenizer) -> ReasoningSupport | None:
    """Render one probe conversation with and without each field (the template is the only
    judge of what it takes); None for a model that does not think."""
    markers = think_markers(tokenizer)
    if markers is None:
        return None
    probe = [{"role": "user", "content": "probe"}]

    def render(**kwargs) -> str | None:
        try:
            return tokenizer.apply_chat_template(
                probe, tokenize=False, add_generation_prompt=True, **kwargs
            )
        except Exception:  # a template that fails on a field does not take it
            return None

    plain = render()
    on, off = render(enable_thinking=True), render(enable_thinking=False)
    takes_enable = on is not None and off is not None and on != off
    low, high = render(reasoning_effort="low"), render(reasoning_effort="high")
    return ReasoningSupport(
        markers,
        takes_enable_thinking=takes_enable,
        thinks_by_default=plain == on if takes_enable else True,
        takes_reasoning_effort=low is not None and high is not None and low != high,
    )
