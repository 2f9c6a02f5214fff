"""A broken LLM pod under `iris up`'s parts (iris.up.Platform and its Supervisor): two pods,
one whose every engine step fails (the test-only step-fault hook, which the pod reads only
under IRIS_TEST_HOOKS=1). Every request completes on the other pod; the broken pod reports
itself not ready, exits non-zero after its failures in a row, and the supervisor restarts
it. The gateway routes round-robin: the default policy may send every request to the pod
that already holds the chat template's prefix, and the broken pod must be sent one. Nothing
waits on time: each wait polls for a state with a generous bound."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from iris.up.processes import wait_until
from iris.up.supervisor import RestartPolicy, Supervisor
from llm_svc.server.server import ENGINE_FAILED_EXIT_CODE
from tests.fixtures.platform import POD_HEADER, start_platform

pytestmark = pytest.mark.slow
BOUND_S = 120.0
MAX_ROUNDS = 30  # rounds of 4 concurrent requests until the broken pod has taken one
ROUND_ROBIN_GATEWAY = {**POD_HEADER, "IRIS_GATEWAY_ROUTER_CONFIG": "round-robin"}


def chat(platform, text: str) -> httpx.Response:
    body = {
        "model": platform.model_name,
        "messages": [{"role": "user", "content": text}],
        "max_tokens": 2,
        "temperature": 0,
    }
    return httpx.post(f"{platform.gateway_url}/v1/chat/completions", json=body, timeout=BOUND_S)


def test_a_broken_pod_leaves_rotation_and_is_restarted(tmp_path, tiny_qwen2_vl_dir):
    broken_env = {
        "IRIS_TEST_HOOKS": "1",
        "IRIS_TEST_STEP_FAULT": "step",
        "IRIS_LLM_SHUTDOWN_GRACE_S": "0.5",  # its streams have ended: no need to linger
    }
    platform = start_platform(
        tiny_qwen2_vl_dir,
        tmp_path,
        llm_pods=2,
        extra_env={"gateway": ROUND_ROBIN_GATEWAY, "llm-1": broken_env},
    )
    reports: list[str] = []
    supervisor = Supervisor(
        platform.services,
        lambda service: platform.is_healthy(service, 0.5),
        reports.append,
        RestartPolicy(initial_s=0.5),
    )

    def reported(text: str) -> bool:
        supervisor.tick()
        return any(text in report for report in reports)

    try:
        good, broken = platform.service("llm-0"), platform.service("llm-1")
        first_pid = broken.child.pid
        exited = f"llm-1 exited with code {ENGINE_FAILED_EXIT_CODE}"
        with ThreadPoolExecutor(4) as pool:
            for round_ in range(MAX_ROUNDS):
                texts = [f"Hello {round_}-{i}" for i in range(4)]
                for reply in pool.map(lambda text: chat(platform, text), texts):
                    assert reply.status_code == 200, reply.text
                    assert reply.headers["x-iris-pod"] == good.address
                if broken.child.process.poll() is not None:
                    break
            else:
                pytest.fail(f"llm-1 was never sent a request in {MAX_ROUNDS} rounds")
        assert wait_until(lambda: reported(exited), BOUND_S), reports
        log = broken.child.log_path.read_text()
        assert "not ready: engine step failed (1 in a row, limit 3)" in log, log[-3000:]
        assert "3 engine steps and probes failed in a row" in log, log[-3000:]
        assert wait_until(lambda: reported("restarted llm-1"), BOUND_S), reports
        assert broken.child.pid != first_pid
        # The good pod served on throughout.
        assert chat(platform, "Still there?").status_code == 200
    finally:
        platform.stop()
