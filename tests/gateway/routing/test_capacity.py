"""Capacity-based admission: pods with room, 429 with a Retry-After from measured drain."""

import numpy as np
import pytest

from gateway.errors import APIError
from gateway.routing.capacity import START_LIMIT, PodCapacity
from gateway.routing.config import load_router_config
from gateway.routing.inflight import DrainMeter, InflightLedger
from gateway.routing.kv_index import KVIndex
from gateway.routing.plugins.base import RoutingRequest
from gateway.routing.pods import Pod
from gateway.routing.router import Router

FINGERPRINT = b"\x01" * 32


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def pod(address: str, clock: Clock) -> Pod:
    return Pod(address, page_size=4, healthy=True, inflight=InflightLedger(clock=clock))


def refusal(capacity: PodCapacity, pods) -> APIError:
    with pytest.raises(APIError) as caught:
        capacity.with_room(pods)
    return caught.value


def test_the_drain_meter_is_a_rate_over_its_window():
    clock = Clock()
    meter = DrainMeter(window_s=10, clock=clock)
    assert meter.rate() is None
    meter.add(30)
    assert meter.rate() == 30.0  # at least one second of window
    clock.now += 5
    meter.add(20)
    assert meter.rate() == pytest.approx(10.0)  # 50 over the 5 s since the first
    clock.now += 8  # the first sample leaves the window
    assert meter.rate() == pytest.approx(20 / 8)
    clock.now += 20
    assert meter.rate() is None


def test_a_pod_at_its_request_bound_has_no_room_and_retry_after_follows_its_drain():
    clock = Clock()
    busy, free = pod("busy", clock), pod("free", clock)
    capacity = PodCapacity(max_inflight=2, default_retry_after_s=7)
    tickets = [busy.inflight.open(10) for _ in range(2)]
    assert capacity.with_room([busy, free]) == [free]
    free.inflight.open(10)
    free.inflight.open(10)
    error = refusal(capacity, [busy, free])
    assert error.status == 429 and error.code == "overloaded"
    assert error.retry_after == 7  # nothing measured yet: the default
    assert "busy: 2 of 2 requests" in error.message
    # busy drains 2 streams in the next second: one more slot every 0.5 s -> 1 s (rounded up)
    for ticket in tickets:
        ticket.first_token()
        ticket.close()
    busy.inflight.open(10)
    busy.inflight.open(10)
    assert refusal(capacity, [busy, free]).retry_after == 1


def test_queued_prefill_tokens_bound_and_a_slow_drain_gives_a_longer_retry_after():
    clock = Clock()
    only = pod("p", clock)
    capacity = PodCapacity(max_queued_prefill_tokens=1000, max_retry_after_s=30)
    done = only.inflight.open(100)
    done.first_token()  # 100 prefill tokens drained ...
    clock.now += 10  # ... over 10 s: 10 tokens per second
    assert capacity.with_room([only]) == [only]
    only.inflight.open(999)
    assert capacity.with_room([only]) == [only]  # one prompt fits into a shorter queue
    only.inflight.open(200)  # 1199 queued: 200 tokens must drain first, at 10/s: 20 s
    assert refusal(capacity, [only]).retry_after == 20
    only.inflight.open(5000)  # far over: capped
    assert refusal(capacity, [only]).retry_after == 30


def test_load_from_other_gateways_counts_against_the_bounds():
    clock = Clock()
    only = pod("p", clock)
    before = only.inflight.view()
    only.inflight.observe(running=5, prefill_tokens=0, before=before)
    assert refusal(PodCapacity(max_inflight=5), [only]).status == 429
    assert PodCapacity(max_inflight=6).with_room([only]) == [only]


def test_no_bounds_admit_everything_and_the_router_applies_capacity():
    clock = Clock()
    pods = [pod("a", clock), pod("b", clock)]
    for _ in range(100):
        pods[0].inflight.open(10_000)
    assert PodCapacity().with_room(pods) == pods
    router = Router(load_router_config("prefix-aware"), KVIndex(), 1, PodCapacity(max_inflight=1))
    request = RoutingRequest(np.arange(8, dtype=np.int64), FINGERPRINT)
    assert router.route(request, pods).pod.address == "b"  # a is full, whatever it scores
    with pytest.raises(APIError) as caught:
        router.route(request, pods)  # now b holds one too
    assert caught.value.status == 429 and caught.value.retry_after >= 1


def test_the_request_limit_learns_only_at_its_limit_shrinking_when_first_tokens_come_late():
    clock = Clock()
    only = pod("p", clock)
    capacity = PodCapacity(max_inflight=64, wait_factor=2.0)

    def first_tokens_after(wait_s: float, count: int) -> None:
        for _ in range(count):
            ticket = only.inflight.open(10)
            clock.now += wait_s
            ticket.first_token()
            ticket.close()
            capacity.request_limit(only)  # routing reads the limit for every request

    assert capacity.request_limit(only) == START_LIMIT
    first_tokens_after(0.010, 20)  # the floor: 10 ms
    first_tokens_after(0.100, 20)  # late, but with the pod far below its limit: no lesson
    assert capacity.request_limit(only) == START_LIMIT
    held = [only.inflight.open(10) for _ in range(int(START_LIMIT))]  # at the limit now
    first_tokens_after(0.010, 60)
    first_tokens_after(0.100, 3)  # a few late ones: the recent median decides, not one
    assert capacity.request_limit(only) > START_LIMIT
    held += [only.inflight.open(10) for _ in range(4)]  # past the limit
    first_tokens_after(0.100, 30)  # 10x the floor, again and again: the pod is queueing
    assert capacity.request_limit(only) == 1
    error = refusal(capacity, [only])
    assert error.status == 429 and f"{len(held)} of 1 requests" in error.message
    first_tokens_after(0.012, 300)  # fast again while at the limit: it grows back
    assert capacity.request_limit(only) > START_LIMIT
    held += [only.inflight.open(10) for _ in range(100)]
    first_tokens_after(0.012, 5000)
    assert capacity.request_limit(only) == 64  # never past the ceiling
