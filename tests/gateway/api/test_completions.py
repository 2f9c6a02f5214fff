"""Completions: text and token-id prompts, several prompts, streaming."""

import json

import pytest


@pytest.fixture(autouse=True)
def fresh_script(qwen_gateway_parts):
    pod = qwen_gateway_parts["pod"]
    pod.reset(text=["Par", "is"])
    yield pod


def test_text_prompt(client, model_name, fresh_script):
    data = client.post("/v1/completions", json={"model": model_name, "prompt": "The capital"})
    assert data.status_code == 200, data.text
    body = data.json()
    assert body["object"] == "text_completion"
    assert body["choices"][0]["text"] == "Paris"
    assert fresh_script.requests[0].sampling.max_tokens == 16  # OpenAI's default
    assert body["usage"]["prompt_tokens"] == len(fresh_script.requests[0].input_ids)


def test_token_prompts_give_one_choice_per_prompt_and_n(client, model_name, fresh_script):
    body = {"model": model_name, "prompt": [[1, 2, 3], [4, 5]], "n": 2, "logprobs": 1}
    data = client.post("/v1/completions", json=body).json()
    assert [c["index"] for c in data["choices"]] == [0, 1, 2, 3]
    sent = sorted(list(r.input_ids) for r in fresh_script.requests)
    assert sent == [[1, 2, 3], [1, 2, 3], [4, 5], [4, 5]]
    assert data["usage"]["prompt_tokens"] == 5  # each prompt counted once
    logprobs = data["choices"][0]["logprobs"]
    assert logprobs["tokens"] == ["Par", "is"]
    assert logprobs["text_offset"] == [0, 3]
    assert logprobs["top_logprobs"][0] == {"Par": -0.5}


def test_stream_ends_with_done(client, model_name):
    body = {"model": model_name, "prompt": "x", "stream": True}
    response = client.post("/v1/completions", json=body)
    lines = [line for line in response.text.split("\n") if line.startswith("data: ")]
    assert lines[-1] == "data: [DONE]"
    chunks = [json.loads(line[6:]) for line in lines[:-1]]
    assert "".join(c["choices"][0]["text"] for c in chunks) == "Paris"
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"


def test_models_lists_the_served_model(client, model_name):
    data = client.get("/v1/models").json()
    assert [m["id"] for m in data["data"]] == [model_name]
    assert data["data"][0]["max_model_len"] == 4096  # the pod's
    assert client.get(f"/v1/models/{model_name}").json()["id"] == model_name
