"""A real LLM pod's readiness (gRPC health) and the gateway following it: a pod whose
engine step hangs while work waits, or whose engine thread dies, turns NOT_SERVING, the
gateway stops routing to it at once and its /readyz says so; a pod whose step completes
again is routed to again. The pod runs the real tiny engine on its own loop thread; the
test only replaces its step with one that waits on an event (or dies), on the engine
thread between steps."""

from __future__ import annotations

import threading

import grpc
import httpx
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from iris.up.processes import wait_until
from llm_svc.proto import llm_pb2_grpc
from tests.gateway.helpers import make_client, wait_ready
from tests.llm_svc.server.pods import PodThread, pod_settings, request

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


class EngineDied(BaseException):
    """Not an Exception: the worker's step guard does not catch it, so the thread ends."""


@pytest.fixture
def pod(tiny_qwen2_vl_dir):
    running = PodThread(pod_settings(tiny_qwen2_vl_dir, step_stall_s=0.3, health_interval_s=0.05))
    yield running
    running.close()


def pod_status(address: str) -> int:
    with grpc.insecure_channel(address) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        return stub.Check(health_pb2.HealthCheckRequest(service="iris.llm.LLM"), timeout=5).status


def generate_in_background(address: str) -> threading.Thread:
    """A Generate the pod takes in (its stream is read until it ends or breaks)."""

    def run() -> None:
        with grpc.insecure_channel(address) as channel:
            try:
                for _ in llm_pb2_grpc.LLMStub(channel).Generate(request("r1", [1, 2, 3], 4)):
                    pass
            except grpc.RpcError:
                pass

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def chat_body(parts) -> dict:
    return {
        "model": parts["model_dir"].name,
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 2,
    }


def test_a_stalled_step_takes_the_pod_out_of_routing_until_it_completes(qwen_gateway_parts, pod):
    with make_client(qwen_gateway_parts, llm_addresses=[pod.address]) as client:
        wait_ready(client)
        gate = threading.Event()

        def hold(engine) -> None:
            step = engine.step

            def held_step():
                gate.wait(60)
                return step()

            engine.step = held_step

        pod.on_engine(hold)
        sender = generate_in_background(pod.address)
        assert wait_until(lambda: pod_status(pod.address) == NOT_SERVING, 30)
        assert "the engine thread has made no progress" in pod.server.readiness.reason
        assert wait_until(lambda: client.get("/readyz").status_code == 503, 30)
        refused = client.post("/v1/chat/completions", json=chat_body(qwen_gateway_parts))
        assert refused.status_code == 503, refused.text

        gate.set()
        sender.join(30)
        assert wait_until(lambda: pod_status(pod.address) == SERVING, 30)
        wait_ready(client)
        served = client.post("/v1/chat/completions", json=chat_body(qwen_gateway_parts))
        assert served.status_code == 200, served.text


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_a_dead_engine_thread_is_not_serving_and_not_live(qwen_gateway_parts, pod):
    with make_client(qwen_gateway_parts, llm_addresses=[pod.address]) as client:
        wait_ready(client)

        def die(engine) -> None:
            def fatal_step():
                raise EngineDied("the device went away")

            engine.step = fatal_step

        pod.on_engine(die)
        generate_in_background(pod.address)
        assert wait_until(lambda: not pod.server.worker.alive, 30)
        assert wait_until(lambda: pod_status(pod.address) == NOT_SERVING, 30)
        assert pod.server.readiness.reason == "the engine thread has ended"
        live = httpx.get(f"http://127.0.0.1:{pod.server.metrics_port}/healthz", timeout=5)
        assert live.status_code == 503
        assert wait_until(lambda: client.get("/readyz").status_code == 503, 30)
