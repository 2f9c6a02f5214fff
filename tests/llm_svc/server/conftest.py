"""Fixtures of the LLM server tests: pods built once per session (the engine loads in a
couple of seconds), each with the settings its tests need. Tests on a shared pod use fresh
request ids and never assume an empty prefix cache."""

from __future__ import annotations

from collections.abc import Iterator

import grpc
import pytest

from llm_svc.proto import llm_pb2_grpc
from tests.llm_svc.server.pods import PodThread, pod_settings


@pytest.fixture(scope="session")
def pod(tiny_idefics3_dir) -> Iterator[PodThread]:
    """The shared pod: 128 pages of 4 tokens, 8 sequences, 64 tokens per step."""
    running = PodThread(pod_settings(tiny_idefics3_dir))
    yield running
    running.close()


@pytest.fixture
async def channel(pod) -> grpc.aio.Channel:
    async with grpc.aio.insecure_channel(pod.address) as opened:
        yield opened


@pytest.fixture
def stub(channel) -> llm_pb2_grpc.LLMStub:
    return llm_pb2_grpc.LLMStub(channel)
