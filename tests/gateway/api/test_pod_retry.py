"""A pod that fails a request after accepting it, before anything of it reached the client:
the gateway starts the request again, once, on another pod — streamed, whole, and with n
choices. Two scripted pods (real gRPC) behind one gateway; pod "broken" fails every call
right after acceptance, pod "good" answers."""

from __future__ import annotations

import json

import pytest

from tests.gateway.fake_services import PodScript, serve_pod
from tests.gateway.helpers import make_client, wait_ready

MAX_TRIES = 20  # requests until one was routed to the broken pod first


@pytest.fixture(scope="module")
def two_pods(qwen_gateway_parts):
    fingerprint = qwen_gateway_parts["adapter"].fingerprint
    servers, pods = [], {}
    for name in ("broken", "good"):
        server, address, pod = serve_pod(PodScript(fingerprint))
        servers.append(server)
        pods[name] = (address, pod)
    parts = {**qwen_gateway_parts, "pod_address": pods["good"][0]}
    addresses = [pods["broken"][0], pods["good"][0]]
    # Key limits on, with rates so slow that a bucket refills nothing during the test: what
    # a request takes from them can be read back.
    limits = dict(
        key_requests_per_s=1e-9,
        key_request_burst=10_000,
        key_prompt_tokens_per_s=1e-9,
        key_prompt_token_burst=10**9,
    )
    with make_client(parts, llm_addresses=addresses, **limits) as client:
        wait_ready(client)
        yield client, pods
    for server in servers:
        server.stop(0)


CASES = {
    "whole": {},
    "streamed": {"stream": True},
    "n choices, whole": {"n": 2},
    "n choices, streamed": {"n": 2, "stream": True},
}


def _texts(response, streamed: bool) -> list[str]:
    if not streamed:
        return [choice["message"]["content"] for choice in response.json()["choices"]]
    lines = [line[6:] for line in response.text.split("\n") if line.startswith("data: ")]
    assert lines[-1] == "[DONE]", lines
    events = [json.loads(line) for line in lines[:-1]]
    assert not any("error" in event for event in events), events
    texts: dict[int, str] = {}
    for event in events:
        for choice in event["choices"]:
            texts[choice["index"]] = texts.get(choice["index"], "") + choice["delta"].get(
                "content", ""
            )
    return [texts[i] for i in sorted(texts)]


@pytest.mark.parametrize("case", list(CASES))
def test_a_pod_failing_before_any_output_is_retried_on_another(two_pods, model_name, case):
    client, pods = two_pods
    broken, good = pods["broken"][1], pods["good"][1]
    broken.reset()
    good.reset()
    broken.script.fail_after_accept = 10_000
    extra = CASES[case]
    streamed = bool(extra.get("stream"))
    limits = client.app.state.gateway.key_limits
    for attempt in range(MAX_TRIES):
        levels = {kind: limits.level(None, kind) for kind in ("requests", "prompt tokens")}
        body = {
            "model": model_name,
            "messages": [{"role": "user", "content": f"{case} {attempt}"}],
            "seed": 1,
            **extra,
        }
        response = client.post("/v1/chat/completions", json=body)
        assert response.status_code == 200, response.text
        assert _texts(response, streamed) == ["Hello world"] * extra.get("n", 1)
        if broken.requests:
            break
    else:
        pytest.fail(f"no request was routed to the broken pod in {MAX_TRIES} tries")
    # Every choice that met the broken pod ran again, on the good pod only.
    assert len(good.requests) >= extra.get("n", 1)
    # The key paid for one request and its prompt once per choice (n x prompt, the charging
    # rule), though it ran twice.
    prompt_tokens = len(good.requests[-1].input_ids) * extra.get("n", 1)
    assert levels["requests"] - limits.level(None, "requests") == pytest.approx(1, abs=1e-3)
    spent = levels["prompt tokens"] - limits.level(None, "prompt tokens")
    assert spent == pytest.approx(prompt_tokens, abs=1e-3)


def test_a_stream_that_has_begun_is_not_started_again(two_pods, model_name):
    """Once a choice's first token may have reached the client, a pod failure ends the
    stream with an error event: starting again would repeat what the client already has."""
    client, pods = two_pods
    broken, good = pods["broken"][1], pods["good"][1]
    broken.reset()
    good.reset()
    broken.script.fail_after_first_token = 10_000
    for attempt in range(MAX_TRIES):
        body = {
            "model": model_name,
            "messages": [{"role": "user", "content": f"begun {attempt}"}],
            "stream": True,
        }
        before = len(good.requests)
        response = client.post("/v1/chat/completions", json=body)
        assert response.status_code == 200, response.text
        if broken.requests:
            break
    else:
        pytest.fail(f"no request was routed to the broken pod in {MAX_TRIES} tries")
    events = [line[6:] for line in response.text.split("\n") if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    assert "Hello" in events[1] and "error" in json.loads(events[-2]), events
    assert len(good.requests) == before  # not started again
