"""Cost is charged where it is spent (gateway/key_limits.py, gateway/api/generation.py):
n x the prompt to the prompt-token bucket, every produced token to the completion-token
bucket (streamed or not), and a whole response's size bounded. Through the real gateway
app and the scripted pod of tests/gateway/conftest.py, which answers two tokens."""

from __future__ import annotations

import asyncio

import pytest

from gateway.api.generation import Choice, streamed
from llm_svc.proto import llm_pb2
from tests.gateway.helpers import make_client, wait_ready

SLOW = 0.0001  # tokens per second: no refill within a test
MESSAGES = [{"role": "user", "content": "Say hello."}]


def headers(key: str) -> dict:
    return {"Authorization": f"Bearer {key}"}


def chat(client, model_name: str, key: str, **extra):
    body = {"model": model_name, "messages": MESSAGES, "max_tokens": 4, **extra}
    return client.post("/v1/chat/completions", json=body, headers=headers(key))


@pytest.fixture(scope="module")
def prompt_tokens(client, model_name, qwen_gateway_parts) -> int:
    qwen_gateway_parts["pod"].reset(text=["Hello", " world"])
    answer = client.post(
        "/v1/chat/completions", json={"model": model_name, "messages": MESSAGES, "max_tokens": 4}
    )
    return answer.json()["usage"]["prompt_tokens"]


def test_n_choices_charge_n_times_the_prompt(qwen_gateway_parts, model_name, prompt_tokens):
    # A burst just under 2 prompts: n=2 runs it into debt (the next request waits); n=1
    # leaves some (the next is admitted).
    with make_client(
        qwen_gateway_parts,
        api_keys=["two", "one"],
        key_prompt_tokens_per_s=SLOW,
        key_prompt_token_burst=2 * prompt_tokens - 1,
    ) as client:
        wait_ready(client)
        assert chat(client, model_name, "two", n=2).status_code == 200
        refused = chat(client, model_name, "two")
        assert refused.status_code == 429 and "prompt tokens" in refused.json()["error"]["message"]
        assert int(refused.headers["retry-after"]) >= 1
        assert chat(client, model_name, "one").status_code == 200
        assert chat(client, model_name, "one").status_code == 200


def test_completion_tokens_are_charged_as_produced_then_refused(qwen_gateway_parts, model_name):
    qwen_gateway_parts["pod"].reset(text=["Hello", " world"])
    with make_client(
        qwen_gateway_parts,
        api_keys=["streamed", "whole"],
        key_completion_tokens_per_s=SLOW,
        key_completion_tokens_burst=1,
    ) as client:
        wait_ready(client)
        # One token of burst; each answer is two tokens, so each key goes into debt.
        with client.stream(
            "POST",
            "/v1/chat/completions",
            json={"model": model_name, "messages": MESSAGES, "max_tokens": 4, "stream": True},
            headers=headers("streamed"),
        ) as stream:
            assert stream.status_code == 200
            assert any("[DONE]" in line for line in stream.iter_lines())
        assert chat(client, model_name, "whole").status_code == 200
        for key in ("streamed", "whole"):
            refused = chat(client, model_name, key)
            assert refused.status_code == 429, refused.text
            assert "completion tokens" in refused.json()["error"]["message"]
            assert int(refused.headers["retry-after"]) >= 1


def test_a_whole_response_over_the_bound_is_a_400_and_a_stream_is_not(
    qwen_gateway_parts, model_name
):
    with make_client(qwen_gateway_parts, max_response_tokens=100) as client:
        wait_ready(client)
        body = {"model": model_name, "messages": MESSAGES, "n": 2, "max_tokens": 10}
        body.update(logprobs=True, top_logprobs=5)  # 2 x 10 x (1 + 5) = 120 > 100
        answer = client.post("/v1/chat/completions", json=body)
        assert answer.status_code == 400
        error = answer.json()["error"]
        assert "120" in error["message"] and "max_response_tokens" in error["message"]
        completions = client.post(
            "/v1/completions",
            json={"model": model_name, "prompt": "hi", "n": 2, "max_tokens": 10, "logprobs": 5},
        )
        assert completions.status_code == 400
        assert "max_response_tokens" in completions.json()["error"]["message"]
        body["top_logprobs"] = 4  # 2 x 10 x (1 + 4) = 100: allowed
        assert client.post("/v1/chat/completions", json=body).status_code == 200
        body["top_logprobs"] = 5
        assert client.post("/v1/chat/completions", json={**body, "stream": True}).status_code == 200


class _Finished:
    """A generation that has already answered (only `responses` and `cancel` are used by
    the stream; a real pod's stream cannot be inspected from inside the gateway)."""

    def __init__(self, messages) -> None:
        self.messages = messages

    async def responses(self):
        for message in self.messages:
            yield message

    def cancel(self) -> None:
        pass


def test_a_stream_keeps_the_count_of_what_it_sent_not_the_tokens():
    chunk = llm_pb2.GenerateResponse(
        tokens=llm_pb2.TokenChunk(token_ids=[1, 2], text="ab", logprobs=[llm_pb2.TokenLogprob()])
    )
    done = llm_pb2.GenerateResponse(finished=llm_pb2.Finished(finish_reason="stop"))
    choices = [Choice(0)]

    async def drain():
        return [item async for item in streamed([_Finished([chunk] * 3 + [done])], choices, 0.0)]

    sent = asyncio.run(drain())
    assert len(sent) == 4
    kept = choices[0]
    assert kept.num_tokens == 6 and kept.finish_reason == "stop"
    assert kept.text == [] and kept.token_ids == [] and kept.logprobs == []
