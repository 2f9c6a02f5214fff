"""A gateway app (TestClient) on the tiny Qwen2-VL model, wired to the scripted pod and
encoder and the real cache of tests/gateway/conftest.py."""

import pytest

from tests.gateway.helpers import make_client, wait_ready


@pytest.fixture(scope="module")
def client(qwen_gateway_parts):
    with make_client(qwen_gateway_parts) as client:
        wait_ready(client)
        yield client


@pytest.fixture(scope="module")
def model_name(tiny_qwen2_vl_dir):
    return tiny_qwen2_vl_dir.name
