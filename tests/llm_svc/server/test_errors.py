"""Every refusal before acceptance, provoked for real and checked: its gRPC status code,
a message naming the value and the limit, and the retry hint when the pod is full."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from iris.proto import common_pb2
from llm_svc.proto import llm_pb2, llm_pb2_grpc
from tests.llm_svc.server.pods import (
    IDLE,
    CacheThread,
    PodThread,
    dead_address,
    idle_engine_state,
    image_request,
    pod_settings,
    request,
)

PROMPT = list(range(20, 52))


async def refusal(stub, message, timeout_s: float = 30.0) -> grpc.aio.AioRpcError:
    """The error a Generate call ends with before any message (fails if it streams)."""
    call = stub.Generate(message, timeout=timeout_s)
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        first = await call.read()
        pytest.fail(f"expected a refusal, got {first}")
    return caught.value


def _item(**fields) -> common_pb2.MultimodalItem:
    base = dict(modality=common_pb2.IMAGE, identity=bytes(32), token_count=4)
    base.update(fields)
    item = common_pb2.MultimodalItem(**base)
    if "offsets" not in fields:
        item.offsets.append(common_pb2.Span(start=2, end=5))
    return item


def _with(**changes) -> llm_pb2.GenerateRequest:
    message = request("bad", PROMPT, 4)
    for name, value in changes.items():
        if name in ("items", "input_ids"):
            del getattr(message, name)[:]
            getattr(message, name).extend(value)
        elif name == "sampling":
            for key, field_value in value.items():
                setattr(message.sampling, key, field_value)
        else:
            setattr(message, name, value)
    return message


BAD_REQUESTS = {
    "token id past the vocabulary": (
        _with(input_ids=[5, 6, 100_000]), ["prompt_token_ids[2]", "100000", "[0, 448)"]
    ),
    "empty prompt": (_with(input_ids=[]), ["prompt_token_ids", "empty"]),
    "prompt as long as the context": (
        _with(input_ids=[7] * 4096), ["4096", "max_model_len 4096"]
    ),
    "top_p above 1": (_with(sampling={"top_p": 2.0}), ["top_p", "2.0", "(0, 1]"]),
    "too many top logprobs": (
        _with(sampling={"logprobs": True, "top_logprobs": 50}), ["logprobs", "50", "[0, 20]"]
    ),
    "another model's fingerprint": (_with(fingerprint=b"\1" * 32), ["fingerprint", "0101"]),
    "identity of 5 bytes": (_with(items=[_item(identity=b"12345")]), ["items[0].identity", "5"]),
    "token_count not the spans' sum": (
        _with(items=[_item(token_count=9)]), ["items[0].token_count=9", "sum 4"]
    ),
    "span past the prompt": (
        _with(items=[_item(offsets=[common_pb2.Span(start=30, end=40)], token_count=11)]),
        ["(30, 40)", "outside"],
    ),
    "overlapping items": (
        _with(items=[_item(), _item(identity=b"\2" * 32)]), ["overlaps"]
    ),
    "an audio item": (
        _with(items=[_item(modality=common_pb2.AUDIO)]), ["items[0].modality=AUDIO", "IMAGE"]
    ),
}  # fmt: skip


@pytest.mark.parametrize("case", list(BAD_REQUESTS))
async def test_a_bad_request_is_invalid_argument_naming_value_and_limit(stub, pod, case):
    message, words = BAD_REQUESTS[case]
    error = await refusal(stub, message)
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT, error.details()
    for word in words:
        assert word in error.details(), (word, error.details())
    assert pod.on_engine(idle_engine_state) == IDLE


# --- the queue bound ---------------------------------------------------------------


@pytest.fixture(scope="module")
def one_seat_pod(tiny_idefics3_dir):
    """One running sequence, one waiting request at most."""
    settings = pod_settings(tiny_idefics3_dir, max_num_seqs=1, max_waiting=1, retry_after_ms=750)
    running = PodThread(settings)
    yield running
    running.close()


async def wait_for_waiting(stub, count: int, timeout_s: float = 60.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while (await stub.GetLoad(llm_pb2.LoadRequest())).waiting < count:
        assert loop.time() < deadline, f"never saw {count} waiting"
        await asyncio.sleep(0.01)


async def test_a_full_queue_is_resource_exhausted_with_a_retry_hint(one_seat_pod):
    async with grpc.aio.insecure_channel(one_seat_pod.address) as channel:
        stub = llm_pb2_grpc.LLMStub(channel)
        running = stub.Generate(request("seat", PROMPT, 300))
        assert (await running.read()).HasField("accepted")
        queued = stub.Generate(request("queued", PROMPT, 300))
        await wait_for_waiting(stub, 1)

        error = await refusal(stub, request("refused", PROMPT, 4))
        assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "1 requests are waiting" in error.details() and "limit is 1" in error.details()
        assert ("retry-after-ms", "750") in tuple(error.trailing_metadata())

        # Abort of a request still waiting: its stream ends CANCELLED, never accepted.
        assert (await stub.Abort(llm_pb2.AbortRequest(request_id="queued"))).found
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await queued.read()
        assert caught.value.code() == grpc.StatusCode.CANCELLED
        running.cancel()
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 10
    while one_seat_pod.on_engine(idle_engine_state) != IDLE and loop.time() < deadline:
        await asyncio.sleep(0.02)
    assert one_seat_pod.on_engine(idle_engine_state) == IDLE


# --- the multimodal refusals (real cache service) ------------------------------------


@pytest.fixture(scope="module")
def cache_service():
    service = CacheThread()
    yield service
    service.close()


@pytest.fixture(scope="module")
def mm_pod(tiny_idefics3_dir, cache_service):
    settings = pod_settings(
        tiny_idefics3_dir, cache_address=cache_service.address, embedding_wait_s=2.0
    )
    running = PodThread(settings)
    yield running
    running.close()


@pytest.fixture(scope="module")
def cacheless_pod(tiny_idefics3_dir):
    settings = pod_settings(tiny_idefics3_dir, cache_address=dead_address(), cache_timeout_s=1.0)
    running = PodThread(settings)
    yield running
    running.close()


async def _refusal_on(pod: PodThread, message) -> grpc.aio.AioRpcError:
    async with grpc.aio.insecure_channel(pod.address) as channel:
        return await refusal(llm_pb2_grpc.LLMStub(channel), message)


async def test_an_image_in_neither_prefix_nor_cache_is_embedding_missing(mm_pod, tiny_idefics3_dir):
    message, _ = image_request(tiny_idefics3_dir, mm_pod.engine.fingerprint, "mm-missing")
    error = await _refusal_on(mm_pod, message)
    assert error.code() == grpc.StatusCode.FAILED_PRECONDITION, error.details()
    assert "embedding missing" in error.details()


async def test_a_failed_image_is_invalid_argument_with_its_reason(
    mm_pod, cache_service, tiny_idefics3_dir
):
    from embedding_cache_svc.client import AsyncCacheClient

    fingerprint = mm_pod.engine.fingerprint
    message, item = image_request(tiny_idefics3_dir, fingerprint, "mm-failed", seed=1)
    reason = "image bytes are not a PNG, JPEG or WebP"
    async with AsyncCacheClient(cache_service.address, fingerprint) as cache:
        await cache.reserve([(item.key, item.token_count)], lease_ms=10_000)
        await cache.fail(item.key, reason, item.token_count)
    error = await _refusal_on(mm_pod, message)
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT, error.details()
    assert reason in error.details()


async def test_an_unreachable_cache_is_failed_precondition_not_try_another_pod(
    cacheless_pod, tiny_idefics3_dir
):
    # Not UNAVAILABLE: that would send the gateway to the next pod, which shares the cache.
    message, _ = image_request(tiny_idefics3_dir, cacheless_pod.engine.fingerprint, "mm-nocache")
    error = await _refusal_on(cacheless_pod, message)
    assert error.code() == grpc.StatusCode.FAILED_PRECONDITION, error.details()
    assert "embedding cache unavailable" in error.details()
    assert "embedding missing" not in error.details()
