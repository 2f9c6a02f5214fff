"""Schemathesis against /openapi.json of a live gateway (uvicorn on loopback, wired to the
scripted pod and encoder and the real cache): generated requests, valid or not, never get
a 5xx, and every response matches its documented status codes and schema."""

import threading
import time

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    response_schema_conformance,
    status_code_conformance,
)

from gateway.app import create_app
from gateway.service import Gateway
from gateway.settings import GatewaySettings
from iris.up.processes import free_port


@pytest.fixture(scope="module")
def live_gateway(qwen_gateway_parts):
    import httpx
    import uvicorn

    parts = qwen_gateway_parts
    settings = GatewaySettings.load(
        model=str(parts["model_dir"]),
        llm_addresses=[parts["pod_address"]],
        encoder_addresses=[parts["encoder_address"]],
        cache_address=parts["cache_address"],
        load_poll_interval_s=0.05,
        max_n=4,
    )
    port = free_port()
    app = create_app(settings, Gateway(settings, parts["adapter"]))
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="error"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{port}"
    for _ in range(300):
        try:
            if httpx.get(f"{url}/readyz", timeout=1).status_code == 200:
                break
        except httpx.HTTPError:
            pass
        time.sleep(0.05)
    yield url
    server.should_exit = True
    thread.join(timeout=10)


def test_generated_requests_never_get_a_server_error(live_gateway):
    schema = schemathesis.openapi.from_url(f"{live_gateway}/openapi.json")
    checks = [not_a_server_error, status_code_conformance, response_schema_conformance]
    tested = []
    for result in schema.get_all_operations():
        operation = result.ok()
        if operation.path == "/metrics":
            continue

        @settings(
            max_examples=20, deadline=None, database=None, suppress_health_check=list(HealthCheck)
        )
        @given(case=operation.as_strategy())
        def run(case):
            case.call_and_validate(base_url=live_gateway, checks=checks)

        run()
        tested.append(operation.path)
    assert "/v1/chat/completions" in tested and "/v1/completions" in tested
