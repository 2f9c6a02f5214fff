"""Bodies over the parse threshold are parsed in the gateway's worker processes and come
back equal to the parse on the event loop (a real gateway process: tests/gateway/
hostile_door.py, with a 4 KiB threshold; the scripted pod records what it is asked). The
same request is sent small (parsed on the loop) and padded with JSON whitespace past the
threshold (parsed in a process): the pod receives the same request, or the client the same
error. Refusals by count come before any parse, on the loop or in a process."""

from __future__ import annotations

import json
import re

import httpx

from tests.gateway.hostile_door import LIMITS, Hostile, openai_error

THRESHOLD = LIMITS["parse_in_process_max_bytes"]


def parses(hostile: Hostile) -> dict[str, float]:
    """iris_gateway_body_parses_total by where (loop, process)."""
    page = httpx.get(f"http://127.0.0.1:{hostile.metrics_port}/metrics").text
    found = re.findall(r'iris_gateway_body_parses_total\{where="(\w+)"\} (\S+)', page)
    return {"loop": 0.0, "process": 0.0} | {where: float(n) for where, n in found}


def small_and_padded(hostile: Hostile, pod, path: str, body: dict):
    """The responses to `body` sent compact (parsed on the loop) and padded (in a process),
    and the scripted pod's request for each (None where none was made)."""
    compact = json.dumps(body).encode()
    assert len(compact) <= THRESHOLD
    padded = b" " * THRESHOLD + compact + b"\n" * THRESHOLD  # JSON whitespace
    answers, asked = [], []
    for raw, where in ((compact, "loop"), (padded, "process")):
        before, seen = parses(hostile), len(pod.requests)
        answers.append(hostile.post(path, raw))
        after = parses(hostile)
        assert after[where] == before[where] + 1, (where, before, after)
        asked.append(pod.requests[-1] if len(pod.requests) > seen else None)
    return answers, asked


def test_a_large_chat_body_parsed_in_a_process_asks_the_pod_the_same(hostile, qwen_gateway_parts):
    body = {
        "model": hostile.model,
        "messages": [
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": [{"type": "text", "text": "é€ hello"}]},
            {"role": "assistant", "content": "hi"},
            {"role": "user", "content": "again"},
        ],
        "max_tokens": 3,
        "temperature": 0.5,
        "stop": ["x", "yz"],
        "logit_bias": {"5": 2, "7": -1},
        "seed": 11,
        "metadata": {"ignored": True},
    }
    (small, padded), (asked_small, asked_padded) = small_and_padded(
        hostile, qwen_gateway_parts["pod"], "/v1/chat/completions", body
    )
    assert small.status_code == padded.status_code == 200, (small.text, padded.text)
    assert small.json()["choices"] == padded.json()["choices"]
    assert _without_ids(asked_small) == _without_ids(asked_padded)


def test_a_large_token_id_prompt_parsed_in_a_process_asks_the_pod_the_same(
    hostile, qwen_gateway_parts
):
    ids = [(i * 7) % 100 + 1 for i in range(300)]
    body = {"model": hostile.model, "prompt": ids, "max_tokens": 2, "top_p": 0.9}
    (small, padded), (asked_small, asked_padded) = small_and_padded(
        hostile, qwen_gateway_parts["pod"], "/v1/completions", body
    )
    assert small.status_code == padded.status_code == 200, (small.text, padded.text)
    assert _without_ids(asked_small) == _without_ids(asked_padded)
    assert list(asked_padded.input_ids) == ids


def test_errors_found_in_a_process_are_the_errors_found_on_the_loop(hostile, qwen_gateway_parts):
    model = hostile.model
    for path, body in (
        ("/v1/chat/completions", {"model": model, "messages": [], "n": 0}),
        ("/v1/chat/completions", {"model": model, "messages": [{"role": "x"}], "stop": [1]}),
        ("/v1/completions", {"model": model, "prompt": [1, 2, "three"]}),
        ("/v1/completions", {"model": model, "prompt": "a", "stop": ["s" * 2000]}),
        ("/v1/chat/completions", {"model": model, "messages": [{"role": "user"}], "tools": 5}),
    ):
        (small, padded), _ = small_and_padded(hostile, qwen_gateway_parts["pod"], path, body)
        assert small.status_code == padded.status_code == 400, (small.text, padded.text)
        assert small.json() == padded.json()


def test_unreadable_bodies_are_refused_alike_in_a_process_and_on_the_loop(hostile):
    path = "/v1/chat/completions"
    for small, large in (
        (b'{"model": "m", "messages": [', b'{"model": "m", "messages": [' + b" " * THRESHOLD),
        (b"[" * 1500 + b"]" * 1500, b"[" * 30_000 + b"]" * 30_000),  # past the parser's depth
        (b'{"model": "\xff"}', b'{"model": "\xff"}' + b" " * THRESHOLD),  # not UTF-8
    ):
        before = parses(hostile)
        answers = [hostile.post(path, small), hostile.post(path, large)]
        after = parses(hostile)
        assert (after["loop"], after["process"]) == (before["loop"] + 1, before["process"] + 1)
        assert [a.status_code for a in answers] == [400, 400], [a.text for a in answers]
        assert openai_error(answers[0], 400) == openai_error(answers[1], 400)


def test_refusals_by_count_come_before_any_parse(hostile):
    values, objects = LIMITS["max_body_values"], LIMITS["max_body_objects"]
    before = parses(hostile)
    # Over the values cap and not even JSON: the count answers, no parser sees it.
    crowded = b"," * (values + 1)
    error = openai_error(hostile.post("/v1/chat/completions", crowded), 413)
    assert f"over the limit of {values}" in error["message"]
    many = b"{" * (objects + 1)
    error = openai_error(hostile.post("/v1/chat/completions", many), 413)
    assert f"over the limit of {objects}" in error["message"]
    over = b" " * (LIMITS["max_completions_body_bytes"] + 1)
    openai_error(hostile.post("/v1/completions", over), 413)
    assert parses(hostile) == before


def _without_ids(request) -> bytes:
    """A GenerateRequest without what differs between two sends: its id and trace."""
    assert request is not None
    copy = type(request)()
    copy.CopyFrom(request)
    copy.ClearField("request_id")
    copy.ClearField("trace")
    return copy.SerializeToString(deterministic=True)
