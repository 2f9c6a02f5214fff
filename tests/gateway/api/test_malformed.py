"""Malformed requests: each gets a 4xx with OpenAI's error body; the gateway stays up.

The fixture's pod would answer a well-formed request with 200, so a case that slipped
through validation fails here rather than passing as a 503.
"""

import pytest

from tests.gateway.helpers import data_url, image_message, make_client, png_bytes

MODEL = "<model>"  # replaced by the served model's name
TEXT = [{"role": "user", "content": "hi"}]
IMG = png_bytes()


def chat(**fields):
    return {"model": MODEL, "messages": TEXT, **fields}


def image_part(url):
    return [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}}]}]


CHAT_CASES = [
    ("not json", b"{", 400),
    ("truncated json", b'{"model": "x", "messages": [', 400),
    ("json array", b"[]", 400),
    ("json string", b'"hello"', 400),
    ("empty object", {}, 400),
    ("missing messages", {"model": MODEL}, 400),
    ("missing model", {"messages": TEXT}, 400),
    ("model not a string", chat(model=5), 400),
    ("unknown model", chat(model="gpt-404"), 404),
    ("messages empty", chat(messages=[]), 400),
    ("messages not a list", chat(messages="hi"), 400),
    ("message not an object", chat(messages=["hi"]), 400),
    ("unknown role", chat(messages=[{"role": "robot", "content": "hi"}]), 400),
    ("missing role", chat(messages=[{"content": "hi"}]), 400),
    ("content a number", chat(messages=[{"role": "user", "content": 5}]), 400),
    ("unknown part type", chat(messages=[{"role": "user", "content": [{"type": "audio"}]}]), 400),
    (
        "text part without text",
        chat(messages=[{"role": "user", "content": [{"type": "text"}]}]),
        400,
    ),
    (
        "image part without url",
        chat(messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]),
        400,
    ),
    ("image url empty", chat(messages=image_part("")), 400),
    ("image url not base64", chat(messages=image_part("data:image/png;base64,%%%")), 400),
    ("image not an image", chat(messages=image_part(data_url(b"hello world"))), 400),
    ("image wrong mime", chat(messages=image_part("data:text/html;base64,aGk=")), 400),
    ("image file scheme", chat(messages=image_part("file:///etc/passwd")), 400),
    ("image remote disabled", chat(messages=image_part("http://169.254.169.254/")), 400),
    ("image truncated png", chat(messages=image_part(data_url(IMG[:40]))), 400),
    ("image aspect ratio over 200", chat(messages=image_part(data_url(png_bytes(1, 5000)))), 400),
    (
        "lone surrogate in content",
        b'{"model": "<model>", "messages": [{"role": "user", "content": "\\ud800"}]}',
        400,
    ),
    (
        "lone surrogate in a text part",
        b'{"model": "<model>", "messages": [{"role": "user", "content": '
        b'[{"type": "text", "text": "a\\udc00"}]}]}',
        400,
    ),
    (
        "lone surrogate in stop",
        b'{"model": "<model>", "messages": [{"role": "user", "content": "hi"}], '
        b'"stop": ["\\udc00"]}',
        400,
    ),
    # A typed placeholder is served as text (tests/gateway/test_hostile_control_tokens.py).
    ("unknown field", chat(frobnicate=1), 400),
    ("n zero", chat(n=0), 400),
    ("n over the limit", chat(n=100), 400),
    ("n a string", chat(n="2"), 400),
    ("temperature negative", chat(temperature=-1), 400),
    ("temperature too high", chat(temperature=3), 400),
    ("temperature a string", chat(temperature="0.5"), 400),
    ("top_p a bool", chat(top_p=True), 400),
    ("top_p zero", chat(top_p=0), 400),
    ("max_tokens zero", chat(max_tokens=0), 400),
    ("max_tokens over the context", chat(max_tokens=10**9), 400),
    ("max_completion_tokens negative", chat(max_completion_tokens=-5), 400),
    ("stop a number", chat(stop=5), 400),
    ("stop empty string", chat(stop=[""]), 400),
    ("too many stops", chat(stop=["a"] * 17), 400),
    ("seed negative", chat(seed=-1), 400),
    ("top_k below -1", chat(top_k=-2), 400),
    ("top_k over int32", chat(top_k=2**40), 400),
    ("min_p above 1", chat(min_p=1.5), 400),
    ("min_p negative", chat(min_p=-0.1), 400),
    ("min_p a string", chat(min_p="0.1"), 400),
    ("frequency penalty too high", chat(frequency_penalty=5), 400),
    ("presence penalty too low", chat(presence_penalty=-5), 400),
    ("stream not a bool", chat(stream="yes"), 400),
    ("top_logprobs too high", chat(logprobs=True, top_logprobs=50), 400),
    ("top_logprobs without logprobs", chat(top_logprobs=2), 400),
    ("mm_hashes a string", chat(messages=[image_message(data_url(IMG))], mm_hashes="ab"), 400),
    ("mm_hashes numbers", chat(messages=[image_message(data_url(IMG))], mm_hashes=[1]), 400),
    ("cache_salt a number", chat(cache_salt=5), 400),
    ("cache_salt empty", chat(cache_salt=""), 400),
    ("cache_salt too long", chat(cache_salt="s" * 257), 400),
]

COMPLETION_CASES = [
    ("prompt missing", {"model": MODEL}, 400),
    ("prompt a number", {"model": MODEL, "prompt": 5}, 400),
    ("prompt empty list", {"model": MODEL, "prompt": []}, 400),
    ("token id negative", {"model": MODEL, "prompt": [1, -2]}, 400),
    ("token id outside the vocab", {"model": MODEL, "prompt": [1, 10**7]}, 400),
    ("mixed prompt list", {"model": MODEL, "prompt": ["a", 1]}, 400),
    ("echo", {"model": MODEL, "prompt": "hi", "echo": True}, 400),
    ("suffix", {"model": MODEL, "prompt": "hi", "suffix": "x"}, 400),
    ("best_of differs from n", {"model": MODEL, "prompt": "hi", "best_of": 3}, 400),
    ("logprobs too high", {"model": MODEL, "prompt": "hi", "logprobs": 50}, 400),
    ("unknown model", {"model": "nope", "prompt": "hi"}, 404),
    ("empty text prompt", {"model": MODEL, "prompt": ""}, 400),
    ("an empty prompt among several", {"model": MODEL, "prompt": ["a", ""]}, 400),
    ("lone surrogate in prompt", b'{"model": "<model>", "prompt": "\\ud800"}', 400),
    ("cache_salt a list", {"model": MODEL, "prompt": "hi", "cache_salt": ["a"]}, 400),
]


def send(client, path, body, model_name):
    if isinstance(body, bytes):
        body = body.replace(b'"<model>"', f'"{model_name}"'.encode())
        return client.post(path, content=body, headers={"content-type": "application/json"})
    if body.get("model") == MODEL:
        body = {**body, "model": model_name}
    return client.post(path, json=body)


def assert_openai_error(response, status):
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert isinstance(error["message"], str) and error["message"]
    assert isinstance(error["type"], str)


@pytest.mark.parametrize(("name", "body", "status"), CHAT_CASES, ids=[c[0] for c in CHAT_CASES])
def test_malformed_chat_request(client, model_name, name, body, status):
    assert_openai_error(send(client, "/v1/chat/completions", body, model_name), status)
    assert client.get("/healthz").status_code == 200


@pytest.mark.parametrize(
    ("name", "body", "status"), COMPLETION_CASES, ids=[c[0] for c in COMPLETION_CASES]
)
def test_malformed_completion_request(client, model_name, name, body, status):
    assert_openai_error(send(client, "/v1/completions", body, model_name), status)


def test_a_validation_error_names_the_param_and_the_value(client, model_name):
    response = client.post(
        "/v1/chat/completions", json={"model": model_name, "messages": TEXT, "max_tokens": -5}
    )
    assert_openai_error(response, 400)
    error = response.json()["error"]
    assert error["param"] == "max_tokens" and "(got -5)" in error["message"]
    body = {"model": model_name, "messages": TEXT, "stop": ["a"] * 17}
    assert send(client, "/v1/chat/completions", body, model_name).json()["error"]["param"] == "stop"


def test_a_chat_too_long_for_the_context_names_messages(client, model_name):
    for long in ("word " * 3000, "x" * 10_000_000):  # over by tokens; over by characters
        body = {"model": model_name, "messages": [{"role": "user", "content": long}]}
        response = client.post("/v1/chat/completions", json={**body, "max_tokens": 4})
        assert_openai_error(response, 400)
        error = response.json()["error"]
        assert (error["param"], error["code"]) == ("messages", "context_length_exceeded")


@pytest.mark.parametrize(
    ("path", "body", "message"),
    [
        ("/v1/chat/completions", chat(cache_salt=5), "cache_salt must be a string, got int"),
        (
            "/v1/completions",
            {"model": MODEL, "prompt": "hi", "cache_salt": "s" * 300},
            "cache_salt is 300 characters, over the limit of 256",
        ),
    ],
)
def test_a_bad_cache_salt_is_a_400_naming_the_field(client, model_name, path, body, message):
    response = send(client, path, body, model_name)
    assert_openai_error(response, 400)
    assert response.json()["error"]["param"] == "cache_salt"
    assert message in response.json()["error"]["message"]


def test_there_are_at_least_forty_cases():
    assert len(CHAT_CASES) + len(COMPLETION_CASES) >= 40


def test_unknown_paths_and_methods_are_openai_errors(client):
    assert_openai_error(client.get("/v1/nothing"), 404)
    assert_openai_error(client.get("/v1/chat/completions"), 405)
    assert_openai_error(client.get("/v1/models/other-model"), 404)


def test_oversized_body_is_413(qwen_gateway_parts, model_name):
    with make_client(qwen_gateway_parts, max_body_bytes=1000) as small:
        body = {"model": model_name, "messages": [{"role": "user", "content": "x" * 2000}]}
        assert_openai_error(small.post("/v1/chat/completions", json=body), 413)
        assert small.get("/healthz").status_code == 200


def test_a_well_formed_request_succeeds_on_the_same_gateway(client, model_name):
    response = client.post("/v1/chat/completions", json={"model": model_name, "messages": TEXT})
    assert response.status_code == 200, response.text


def test_a_video_part_to_a_model_without_video_is_refused_by_name(client, model_name):
    """Qwen2-VL here takes images only: a video part is a 400 naming the part, not served
    as nothing."""
    part = {"type": "video_url", "video_url": {"url": "data:video/mp4;base64,AAAA"}}
    text = {"type": "text", "text": "what happens?"}
    body = chat(messages=[{"role": "user", "content": [text, part]}])
    response = send(client, "/v1/chat/completions", body, model_name)
    assert_openai_error(response, 400)
    error = response.json()["error"]
    assert error["param"] == "messages[0].content[1]"
    assert "takes no video" in error["message"]
    assert error["code"] == "videos_not_supported"
