"""Splitting a thinking request's output into reasoning_content and content, and the
reasoning fields' checks (gateway/api/reasoning.py), without a model: pure functions."""

import pytest

from gateway.api.reasoning import ThoughtSplitter, resolve_thinking, split_thought
from gateway.errors import APIError
from iris.models.reasoning import ReasoningSupport, ThinkMarkers

MARKERS = ThinkMarkers("<think>", "</think>", 7, 8)
QWEN3 = ReasoningSupport(MARKERS, True, True, False)


def streamed(chunks: list[str]) -> tuple[str, str]:
    splitter = ThoughtSplitter(MARKERS)
    pieces = [piece for chunk in chunks for piece in splitter.feed(chunk)] + splitter.close()
    thought = "".join(piece.get("reasoning_content", "") for piece in pieces)
    return thought, "".join(piece.get("content", "") for piece in pieces)


@pytest.mark.parametrize(
    "text", ["<think>\nhmm, Paris</think>\n\n{}", "hmm</think>{}", "no end </thi", "</think>x"]
)
def test_every_cut_of_the_stream_gives_the_whole_answer_s_split(text):
    reasoning, content = split_thought(text, MARKERS)
    for cut in range(len(text) + 1):
        for second in range(cut, len(text) + 1):
            chunks = [text[:cut], text[cut:second], text[second:]]
            assert streamed(chunks) == (reasoning or "", content or "")


def test_the_thought_and_the_answer():
    assert split_thought("<think>\nhmm</think>\n\n{}", MARKERS) == ("\nhmm", "\n\n{}")
    assert split_thought("cut short by max_tokens", MARKERS) == ("cut short by max_tokens", None)
    assert split_thought("</think>{}", MARKERS) == (None, "{}")
    # Only the first end marker ends the thought; the answer may spell one.
    assert split_thought("a</think>b</think>", MARKERS) == ("a", "b</think>")


def test_fields_by_what_the_template_takes():
    on = resolve_thinking(None, None, QWEN3)
    assert on.thinks and on.template_kwargs == {}
    off = resolve_thinking({"enable_thinking": False}, None, QWEN3)
    assert not off.thinks and off.template_kwargs == {"enable_thinking": False}
    with pytest.raises(APIError, match="does not take reasoning_effort"):
        resolve_thinking(None, "low", QWEN3)


def test_a_model_that_does_not_think():
    assert not resolve_thinking({"enable_thinking": False}, None, None).thinks
    for kwargs, effort in (({"enable_thinking": True}, None), (None, "high")):
        with pytest.raises(APIError, match="this model does not think"):
            resolve_thinking(kwargs, effort, None)
