"""Deadlines after acceptance, on a real platform whose LLM pod is frozen with SIGSTOP: a
stream the pod stops feeding ends with an `upstream_timeout` error event and [DONE], a whole
answer with a JSON 504, and a Generate the pod never accepts ends at its gRPC deadline.

The pod is frozen only once the gateway has its tokens (the first SSE event; for a whole
answer, the gateway's own gauge showing the request decoding), so the freeze always lands
after acceptance.

On the same platform, through its second gateway (set for it alone), capacity-based
admission (formerly tests/e2e/test_admission.py): above capacity a request gets 429 with
Retry-After at once, and the admitted one completes. The pod is frozen (SIGSTOP) so the
admitted request cannot finish while the others arrive, however fast the machine is; that
gateway's limit is set to one request (fixed: no adaptation), and its poll timeout is long
so the frozen pod is not taken for a dead one meanwhile. It runs first, on the fresh
platform.

And a stream open when its gateway stops (formerly in tests/e2e/test_faults.py) ends with
a `shutting_down` error event and [DONE], through the third gateway, stopped for good: that
test runs last."""

from __future__ import annotations

import json
import signal
import threading
import time
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait

import httpx
import pytest

from gateway.settings import GatewaySettings
from iris.up.metrics_page import metrics_url, scrape
from iris.up.processes import wait_until
from tests.fixtures.platform import FAST_GATEWAY, start_platform

pytestmark = pytest.mark.slow
IDLE_S, DEADLINE_S = 2, 10
LONG = {"max_tokens": 4000, "ignore_eos": True, "temperature": 0}
ADMISSION_GATEWAY, ADMISSION_DEADLINE_S = 1, 120.0
STOPPING_GATEWAY, STOPPING_DEADLINE_S = 2, 90.0
_DEFAULTS = GatewaySettings.model_fields
# The admission gateway ("gateway-1"): what test_admission.py's platform set (FAST_GATEWAY
# comes with every gateway), and the deadlines set for every gateway back at their defaults.
ADMISSION_ENV = {
    "IRIS_GATEWAY_MAX_INFLIGHT_PER_POD": "1",
    "IRIS_GATEWAY_ADMISSION_WAIT_FACTOR": "0",
    "IRIS_GATEWAY_GRPC_TIMEOUT_S": "600",
    "IRIS_GATEWAY_STREAM_IDLE_S": str(_DEFAULTS["stream_idle_s"].default),
    "IRIS_GATEWAY_GENERATE_TIMEOUT_S": str(_DEFAULTS["generate_timeout_s"].default),
}
# The gateway stopped under an open stream ("gateway-2"): what test_faults.py's platform set
# for it (FAST_GATEWAY comes with every gateway), the deadlines back at their defaults.
STOPPING_ENV = {
    "IRIS_GATEWAY_SHUTDOWN_GRACE_S": "3",
    "IRIS_GATEWAY_STREAM_IDLE_S": str(_DEFAULTS["stream_idle_s"].default),
    "IRIS_GATEWAY_GENERATE_TIMEOUT_S": str(_DEFAULTS["generate_timeout_s"].default),
}


@pytest.fixture(scope="module")
def frozen_pod_platform(tmp_path_factory, tiny_qwen2_vl_dir):
    gateway = {
        **FAST_GATEWAY,
        "IRIS_GATEWAY_STREAM_IDLE_S": str(IDLE_S),
        "IRIS_GATEWAY_GENERATE_TIMEOUT_S": str(DEADLINE_S),
    }
    platform = start_platform(
        tiny_qwen2_vl_dir,
        tmp_path_factory.mktemp("deadlines"),
        gateways=3,
        extra_env={"gateway": gateway, "gateway-1": ADMISSION_ENV, "gateway-2": STOPPING_ENV},
    )
    yield platform
    platform.stop()


@pytest.fixture
def pod(frozen_pod_platform):
    """The platform's one pod, thawed and ready again after the test."""
    child = frozen_pod_platform.by_kind("llm")[0].child
    yield child
    child.signal_group(signal.SIGCONT)
    ready = f"{frozen_pod_platform.gateway_url}/readyz"
    assert wait_until(lambda: httpx.get(ready, timeout=5).status_code == 200, 60)


def body(platform, stream: bool) -> dict:
    messages = [{"role": "user", "content": "Count on and on."}]
    return {"model": platform.model_name, "messages": messages, "stream": stream, **LONG}


def admission_chat(platform, index: int) -> httpx.Response:
    body = {
        "model": platform.model_name,
        "messages": [{"role": "user", "content": f"Hello number {index}"}],
        "max_tokens": 3,
        "temperature": 0,
    }
    url = f"{platform.gateway_urls[ADMISSION_GATEWAY]}/v1/chat/completions"
    return httpx.post(url, json=body, timeout=ADMISSION_DEADLINE_S)


def test_above_capacity_requests_get_429_with_retry_after_and_the_admitted_one_completes(
    frozen_pod_platform, pod
):
    platform = frozen_pod_platform
    ready = f"{platform.gateway_urls[ADMISSION_GATEWAY]}/readyz"
    assert wait_until(lambda: httpx.get(ready, timeout=5).status_code == 200, 60)
    try:
        assert admission_chat(platform, 0).status_code == 200  # the platform serves
        pod.signal_group(signal.SIGSTOP)
        with ThreadPoolExecutor(3) as pool:
            pending = {pool.submit(admission_chat, platform, index) for index in (1, 2, 3)}
            refused = []
            deadline = time.monotonic() + ADMISSION_DEADLINE_S
            while len(refused) < 2 and time.monotonic() < deadline:
                done, pending = wait(pending, timeout=1.0, return_when=FIRST_COMPLETED)
                refused += [future.result() for future in done]
            # Two came back while the pod was frozen: the admitted one cannot have.
            assert len(refused) == 2 and len(pending) == 1, [r.text for r in refused]
            for response in refused:
                assert response.status_code == 429, response.text
                assert int(response.headers["retry-after"]) >= 1
                error = response.json()["error"]
                assert error["type"] == "rate_limit_error" and error["code"] == "overloaded"
                assert "at capacity" in error["message"] and "1 of 1 requests" in error["message"]
            pod.signal_group(signal.SIGCONT)
            admitted = pending.pop().result()
        assert admitted.status_code == 200, admitted.text
        assert admitted.json()["choices"][0]["finish_reason"] in ("stop", "length")
        assert admission_chat(platform, 4).status_code == 200  # its slot was given back
    finally:
        pod.signal_group(signal.SIGCONT)


def test_a_stream_whose_pod_goes_silent_ends_with_upstream_timeout(frozen_pod_platform, pod):
    platform = frozen_pod_platform
    url = f"{platform.gateway_url}/v1/chat/completions"
    with httpx.stream("POST", url, json=body(platform, True), timeout=60) as response:
        assert response.status_code == 200
        events = (line for line in response.iter_lines() if line.startswith("data: "))
        next(events)
        pod.signal_group(signal.SIGSTOP)
        rest = list(events)
    assert rest[-1] == "data: [DONE]", rest[-3:]
    error = json.loads(rest[-2].removeprefix("data: "))["error"]
    assert error["code"] == "upstream_timeout", error
    assert f"sent nothing for {IDLE_S} s" in error["message"], error


def test_a_whole_answer_whose_pod_goes_silent_is_a_json_504(frozen_pod_platform, pod):
    platform = frozen_pod_platform
    gauges = metrics_url(platform.service("gateway"))

    def decoding() -> bool:  # the gateway has this request's tokens: it was accepted
        values = scrape(gauges)
        return (
            values.get("iris_gateway_pod_requests_in_flight", 0) == 1
            and values.get("iris_gateway_pod_prefill_tokens_in_flight", 1) == 0
        )

    url = f"{platform.gateway_url}/v1/chat/completions"
    replies: list[httpx.Response] = []

    def send() -> None:
        replies.append(httpx.post(url, json=body(platform, False), timeout=60))

    for _ in range(10):  # a generation that ended before the gauge was read is tried again
        replies.clear()
        sender = threading.Thread(target=send)
        sender.start()
        caught = wait_until(lambda s=sender: decoding() or not s.is_alive(), 60, 0.02)
        if caught and sender.is_alive():
            pod.signal_group(signal.SIGSTOP)
            sender.join(60)
            break
        sender.join(60)
    else:
        pytest.fail("no generation was caught decoding in 10 tries")
    reply = replies[0]
    assert reply.status_code == 504, reply.text
    error = reply.json()["error"]
    assert error["code"] == "upstream_timeout" and error["type"] == "timeout_error", error


def test_a_generate_never_accepted_ends_at_its_deadline(frozen_pod_platform, pod):
    platform = frozen_pod_platform
    pod.signal_group(signal.SIGSTOP)
    url = f"{platform.gateway_url}/v1/chat/completions"
    reply = httpx.post(url, json=body(platform, False), timeout=DEADLINE_S + 60)
    assert reply.status_code == 504, reply.text
    assert reply.json()["error"]["code"] == "upstream_timeout", reply.text


def test_a_stream_open_when_the_gateway_stops_ends_with_an_error_event(frozen_pod_platform, pod):
    """Formerly in tests/e2e/test_faults.py; the last test here: it stops the platform's
    third gateway (set as that test's platform's gateway was). The pod is frozen (SIGSTOP)
    once the stream has begun, so the generation cannot end before the grace period does,
    however fast the machine is."""
    platform = frozen_pod_platform
    gateway = platform.by_kind("gateway")[STOPPING_GATEWAY]
    body = {
        "model": platform.model_name,
        "messages": [{"role": "user", "content": "Count on."}],
        "max_tokens": 1000,
        "ignore_eos": True,
        "stream": True,
    }
    url = f"{platform.gateway_urls[STOPPING_GATEWAY]}/v1/chat/completions"
    with httpx.stream("POST", url, json=body, timeout=STOPPING_DEADLINE_S) as response:
        assert response.status_code == 200
        events = (line for line in response.iter_lines() if line.startswith("data: "))
        next(events)
        pod.signal_group(signal.SIGSTOP)
        gateway.child.signal_group(signal.SIGTERM)
        rest = list(events)
    assert rest[-1] == "data: [DONE]", rest[-3:]
    error = json.loads(rest[-2].removeprefix("data: "))["error"]
    assert error["code"] == "shutting_down", error
    gateway.child.process.wait(30)  # it exits (uvicorn re-raises the SIGTERM it handled, so
    # the code is -15 either way)
