"""Capacity-based admission on a real platform (tiny Qwen2-VL, `iris up` processes): above
capacity a request gets 429 with Retry-After at once, and the admitted one completes.

The pod is frozen (SIGSTOP) so the admitted request cannot finish while the others arrive,
however fast the machine is; its limit is set to one request (fixed: no adaptation), and
the gateway's poll timeout is long so the frozen pod is not taken for a dead one meanwhile.
"""

from __future__ import annotations

import signal
import time
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait

import httpx
import pytest

from tests.fixtures.platform import FAST_GATEWAY, start_platform

pytestmark = pytest.mark.slow
DEADLINE_S = 120.0


def chat(platform, index: int) -> httpx.Response:
    body = {
        "model": platform.model_name,
        "messages": [{"role": "user", "content": f"Hello number {index}"}],
        "max_tokens": 3,
        "temperature": 0,
    }
    url = f"{platform.gateway_url}/v1/chat/completions"
    return httpx.post(url, json=body, timeout=DEADLINE_S)


def test_above_capacity_requests_get_429_with_retry_after_and_the_admitted_one_completes(
    tmp_path, tiny_qwen2_vl_dir
):
    gateway_env = {
        **FAST_GATEWAY,
        "IRIS_GATEWAY_MAX_INFLIGHT_PER_POD": "1",
        "IRIS_GATEWAY_ADMISSION_WAIT_FACTOR": "0",
        "IRIS_GATEWAY_GRPC_TIMEOUT_S": "600",
    }
    platform = start_platform(tiny_qwen2_vl_dir, tmp_path, extra_env={"gateway": gateway_env})
    pod = platform.by_kind("llm")[0].child
    try:
        assert chat(platform, 0).status_code == 200  # the platform serves
        pod.signal_group(signal.SIGSTOP)
        with ThreadPoolExecutor(3) as pool:
            pending = {pool.submit(chat, platform, index) for index in (1, 2, 3)}
            refused = []
            deadline = time.monotonic() + DEADLINE_S
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
        assert chat(platform, 4).status_code == 200  # its slot was given back
    finally:
        pod.signal_group(signal.SIGCONT)
        platform.stop()
