"""A grammar compile killed at its timeout in a real pod, under `iris up`'s parts.

The pod (a real `iris llm` process, reached through the gateway over HTTP) runs one compile
worker, a 2 s compile timeout and the stalling worker module (a test hook, read only under
IRIS_TEST_HOOKS=1): a regex starting `(stall)` never finishes compiling, whatever the
machine's speed, so the pool must kill its worker. A JSON-schema request queued behind it
then compiles in the fresh worker and is answered; an unconstrained request is answered
meanwhile; a variant of the stalled regex with a larger number fails at once from the
failure cache. Nothing waits on time: each wait polls for a state with a generous bound.
"""

from __future__ import annotations

import json
import os
import re
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import jsonschema
import pytest

from iris.metrics import LLM_GRAMMAR_COMPILE_TIMEOUTS, LLM_GRAMMAR_COMPILES
from iris.up.metrics_page import metrics_url, scrape
from iris.up.processes import wait_until
from tests.fixtures.platform import start_platform
from tests.llm_svc.stalling_grammar_worker import STALL

pytestmark = pytest.mark.slow
BOUND_S = 120.0
ROOT = Path(__file__).resolve().parents[2]
STALLING_POD = {
    "IRIS_TEST_HOOKS": "1",
    "IRIS_TEST_GRAMMAR_WORKER": "tests.llm_svc.stalling_grammar_worker",
    "PYTHONPATH": str(ROOT),  # the hook's module lives in the test suite
    "IRIS_LLM_GRAMMAR_COMPILE_THREADS": "1",
    "IRIS_LLM_GRAMMAR_COMPILE_TIMEOUT_S": "2",
    "IRIS_LLM_GRAMMAR_QUEUE_TIMEOUT_S": "600",  # the queued request waits out the stall
    "IRIS_LLM_GRAMMAR_WORKERS_AT_START": "true",  # the workers as deployed
}
SCHEMA = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 12}, "ok": {"type": "boolean"}},
    "required": ["city", "ok"],
    "additionalProperties": False,
}


def chat(platform, **fields) -> httpx.Response:
    body = {
        "model": platform.model_name,
        "messages": [{"role": "user", "content": "Answer."}],
        "max_tokens": 60,
        "temperature": 0,
        **fields,
    }
    return httpx.post(f"{platform.gateway_url}/v1/chat/completions", json=body, timeout=BOUND_S)


def test_a_compile_past_its_timeout_is_killed_and_the_next_compiles_in_a_fresh_worker(
    tmp_path, tiny_qwen2_vl_dir
):
    platform = start_platform(tiny_qwen2_vl_dir, tmp_path, extra_env={"llm-0": STALLING_POD})
    pod = platform.service("llm-0")
    pod_metrics = metrics_url(pod)

    def counted(name: str) -> float:
        return scrape(pod_metrics).get(name, 0.0)

    try:
        with ThreadPoolExecutor(2) as pool:
            stalled = pool.submit(chat, platform, guided_regex=STALL + "a{1,500}")
            # The stalled compile holds the pod's one compile slot from here on.
            assert wait_until(lambda: counted(LLM_GRAMMAR_COMPILES) >= 1, BOUND_S)
            queued = pool.submit(
                chat,
                platform,
                response_format={
                    "type": "json_schema",
                    "json_schema": {"name": "place", "schema": SCHEMA},
                },
            )
            free = chat(platform, max_tokens=4)
            assert free.status_code == 200, free.text
            stalled, queued = stalled.result(BOUND_S), queued.result(BOUND_S)

        assert stalled.status_code == 400, stalled.text
        error = stalled.json()["error"]
        assert error["type"] == "invalid_request_error", error
        assert error["param"] == "guided_regex", error
        assert "did not compile within the limit of 2 s" in error["message"], error

        assert queued.status_code == 200, queued.text
        answer = queued.json()["choices"][0]
        assert answer["finish_reason"] == "stop", answer
        jsonschema.validate(json.loads(answer["message"]["content"]), SCHEMA)

        assert counted(LLM_GRAMMAR_COMPILE_TIMEOUTS) == 1
        assert counted(LLM_GRAMMAR_COMPILES) == 2
        log = pod.child.log_path.read_text()
        killed = re.findall(r"grammar compile worker (\d+) killed", log)
        assert len(killed) == 1, log[-3000:]

        def gone(pid: int) -> bool:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                return True
            return False

        assert wait_until(lambda: gone(int(killed[0])), BOUND_S)

        # A larger number in the same shape buys no second compile: refused at once.
        again = chat(platform, guided_regex=STALL + "a{1,900}")
        assert again.status_code == 400 and "did not compile" in again.json()["error"]["message"]
        assert counted(LLM_GRAMMAR_COMPILES) == 2
    finally:
        platform.stop()
