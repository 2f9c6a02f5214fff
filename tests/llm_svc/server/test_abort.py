"""Abort and disconnect: the request leaves the engine and every page it held is free."""

from __future__ import annotations

import asyncio

import grpc

from iris.metrics import LABEL_REASON, LLM_REQUESTS_FINISHED
from llm_svc.proto import llm_pb2, llm_pb2_grpc
from llm_svc.server.step_failures import step_fault
from tests.llm_svc.server.pods import IDLE, idle_engine_state, request

LONG = 300  # tokens: the stream is still running when the test acts


def prompt(seed: int) -> list[int]:
    return [(13 * i + seed) % 300 + 20 for i in range(30)]


def finished(pod, reason: str) -> float:
    """How many requests the pod has finished for `reason` (its own counter)."""
    value = pod.server.metrics.registry.get_sample_value(
        LLM_REQUESTS_FINISHED, {LABEL_REASON: reason}
    )
    return value or 0.0


async def counted(pod, reason: str, expected: float, timeout_s: float = 30.0) -> float:
    """`finished(pod, reason)` once it reaches `expected` (or at the bound)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while finished(pod, reason) < expected and loop.time() < deadline:
        await asyncio.sleep(0.02)
    return finished(pod, reason)


async def read_rest(call) -> list:
    """The remaining responses of a call read with `read()` (iteration cannot follow it)."""
    rest = []
    while (response := await call.read()) is not grpc.aio.EOF:
        rest.append(response)
    return rest


async def wait_idle(pod, timeout_s: float = 60.0) -> dict:
    """The engine's state once it holds no request (or the last state seen)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while True:
        state = await asyncio.wrap_future(pod.server.worker.call(idle_engine_state))
        if state == IDLE or loop.time() > deadline:
            return state
        await asyncio.sleep(0.02)


async def test_abort_mid_stream_finishes_with_abort_and_frees_pages(stub, pod):
    call = stub.Generate(request("abort-0", prompt(1), LONG))
    assert (await call.read()).HasField("accepted")
    assert (await call.read()).HasField("tokens")
    held = await asyncio.wrap_future(pod.server.worker.call(idle_engine_state))
    assert held["pages_in_use"] > 0 and held["requests"] == 1

    assert (await stub.Abort(llm_pb2.AbortRequest(request_id="abort-0"))).found
    rest = await read_rest(call)
    assert rest[-1].finished.finish_reason == "abort"
    assert 0 < rest[-1].finished.usage.completion_tokens < LONG
    assert await wait_idle(pod) == IDLE


async def test_abort_of_an_unknown_request_finds_nothing(stub):
    reply = await stub.Abort(llm_pb2.AbortRequest(request_id="never-sent"))
    assert not reply.found


async def test_a_client_that_disconnects_frees_its_pages(pod):
    aborted = finished(pod, "abort")
    async with grpc.aio.insecure_channel(pod.address) as channel:
        stub = llm_pb2_grpc.LLMStub(channel)
        call = stub.Generate(request("leaver-0", prompt(2), LONG))
        assert (await call.read()).HasField("accepted")
        assert (await call.read()).HasField("tokens")
        held = await asyncio.wrap_future(pod.server.worker.call(idle_engine_state))
        assert held["pages_in_use"] > 0
    # The channel is closed mid-stream: the server sees the cancellation.
    assert await wait_idle(pod) == IDLE
    assert "leaver-0" not in pod.server.streams
    # Ended by the disconnect, not by length. The count comes with the step after the abort,
    # which may follow the idle check above: poll for it.
    assert await counted(pod, "abort", aborted + 1) == aborted + 1


async def test_a_cancelled_call_frees_its_pages_while_others_run_on(stub, pod):
    aborted = finished(pod, "abort")
    keep = stub.Generate(request("stayer-0", prompt(3), 40))
    leave = stub.Generate(request("leaver-1", prompt(4), LONG))
    assert (await leave.read()).HasField("accepted")
    leave.cancel()
    responses = [response async for response in keep]
    assert responses[-1].finished.usage.completion_tokens == 40
    assert await wait_idle(pod) == IDLE
    assert await counted(pod, "abort", aborted + 1) == aborted + 1


async def test_a_failing_step_fails_its_requests_and_the_pod_serves_on(stub, pod):
    """Fault injection: the engine's next step raises once (nothing real can make it fail);
    the request in that step fails UNAVAILABLE (the pod failed, so another pod may serve
    it), the probe passes and the pod serves on."""

    def break_next_step(engine) -> None:
        engine.step_fault = step_fault("step:1")

    pod.on_engine(break_next_step)
    error = None
    try:
        async for _ in stub.Generate(request("doomed-0", prompt(5), 5)):
            pass
    except grpc.aio.AioRpcError as err:
        error = err
    pod.on_engine(lambda engine: setattr(engine, "step_fault", None))
    assert error is not None and error.code() == grpc.StatusCode.UNAVAILABLE
    assert "injected step fault" in error.details()
    assert await wait_idle(pod) == IDLE
    responses = [response async for response in stub.Generate(request("after-0", prompt(5), 5))]
    assert responses[-1].finished.usage.completion_tokens == 5
