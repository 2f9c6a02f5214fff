"""Scraping pods' /metrics (real HTTP on loopback) and the pod index / selector."""

from __future__ import annotations

import asyncio
import socket

import aiohttp
import pytest
from aiohttp import web

from iris import metrics
from operators.pods import PodRef, index_pod, select_pods
from operators.scrape import ScrapeError, encoder_load, llm_load, parse_gauges, scrape_pool

LLM_PAGE = f"""# HELP {metrics.LLM_KV_UTILISATION} kv
# TYPE {metrics.LLM_KV_UTILISATION} gauge
{metrics.LLM_KV_UTILISATION}{{model="a"}} 0.25
{metrics.LLM_KV_UTILISATION}{{model="b"}} 0.5
# TYPE {metrics.LLM_REQUESTS_WAITING} gauge
{metrics.LLM_REQUESTS_WAITING} 3
# TYPE {metrics.LLM_PENDING_PREFILL_TOKENS} gauge
{metrics.LLM_PENDING_PREFILL_TOKENS} 1200
"""


def test_parse_sums_label_sets():
    load = llm_load(parse_gauges(LLM_PAGE))
    assert (load.kv_utilisation, load.requests_waiting, load.pending_prefill_tokens) == (
        0.75,
        3.0,
        1200.0,
    )


def test_a_missing_metric_is_a_failed_scrape_not_zero():
    page = LLM_PAGE.replace(metrics.LLM_REQUESTS_WAITING, "iris_something_else")
    with pytest.raises(ScrapeError, match=metrics.LLM_REQUESTS_WAITING):
        llm_load(parse_gauges(page))
    with pytest.raises(ScrapeError, match=metrics.ENCODER_BUSY_RATIO):
        encoder_load({metrics.ENCODER_QUEUED_VISION_TOKENS: 5.0})


def test_garbage_is_a_failed_scrape():
    with pytest.raises(ScrapeError):
        parse_gauges("this is { not prometheus\n")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


async def test_scrape_pool_over_http_counts_failures():
    port = _free_port()

    async def good(_):
        return web.Response(text=LLM_PAGE)

    async def broken(_):
        return web.Response(status=500, text="no")

    runners = []
    for ip, handler in (("127.0.0.31", good), ("127.0.0.32", broken)):
        app = web.Application()
        app.router.add_get("/metrics", handler)
        runner = web.AppRunner(app)
        await runner.setup()
        await web.TCPSite(runner, ip, port).start()
        runners.append(runner)
    try:
        pods = {"good": "127.0.0.31", "http500": "127.0.0.32", "down": "127.0.0.33"}
        async with aiohttp.ClientSession() as session:
            loads, failures = await scrape_pool(session, pods, port, 1.0, llm_load)
    finally:
        for runner in runners:
            await runner.cleanup()
    assert [load.requests_waiting for load in loads] == [3.0]
    assert sorted(failures) == ["down", "http500"]
    assert "HTTP 500" in failures["http500"]


async def test_redirects_oversized_malformed_and_silent_pages_are_failed_scrapes():
    """None of these counts as load: a redirect (to a page that would be valid) is not
    followed, a page over the byte bound is not read whole, a malformed page, a NaN gauge
    and a pod that never answers (bounded by the timeout) are failed scrapes."""
    port = _free_port()
    never = asyncio.Event()
    padding = "# " + "x" * 4000 + "\n"

    async def good(_):
        return web.Response(text=LLM_PAGE)

    async def redirect(_):
        raise web.HTTPFound(f"http://127.0.0.41:{port}/metrics")

    async def oversized(_):
        return web.Response(text=padding + LLM_PAGE)

    async def oversized_chunked(request):
        response = web.StreamResponse()
        await response.prepare(request)
        for _ in range(3):
            await response.write(padding.encode())
        await response.write(LLM_PAGE.encode())
        return response

    async def malformed(_):
        return web.Response(text="this is { not prometheus\n")

    async def not_a_number(_):
        return web.Response(text=LLM_PAGE.replace(" 3", " NaN", 1))

    async def silent(_):
        await never.wait()

    handlers = {
        "127.0.0.41": good,
        "127.0.0.42": redirect,
        "127.0.0.43": oversized,
        "127.0.0.44": oversized_chunked,
        "127.0.0.45": malformed,
        "127.0.0.46": not_a_number,
        "127.0.0.47": silent,
    }
    runners = []
    for ip, handler in handlers.items():
        app = web.Application()
        app.router.add_get("/metrics", handler)
        runner = web.AppRunner(app, shutdown_timeout=0.1)
        await runner.setup()
        await web.TCPSite(runner, ip, port).start()
        runners.append(runner)
    names = ["good", "redirect", "oversized", "chunked", "malformed", "nan", "silent"]
    pods = dict(zip(names, handlers, strict=True))
    try:
        async with aiohttp.ClientSession() as session:
            loads, failures = await scrape_pool(session, pods, port, 1.0, llm_load, 2000)
    finally:
        never.set()
        for runner in runners:
            await runner.cleanup()
    assert [load.requests_waiting for load in loads] == [3.0]
    assert sorted(failures) == sorted(names[1:])
    assert "HTTP 302" in failures["redirect"]
    assert "over 2000" in failures["oversized"] and "more than 2000" in failures["chunked"]
    assert "unparsable" in failures["malformed"] and "finite" in failures["nan"]
    assert "Timeout" in failures["silent"]


def _pod_fields(name, labels, ip="10.0.0.1", ready=True, deleting=False):
    return {
        "name": name,
        "namespace": "ns",
        "labels": labels,
        "status": {
            "podIP": ip,
            "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
        },
        "meta": {"deletionTimestamp": "2024-01-01T00:00:00Z"} if deleting else {},
    }


def test_index_and_select_by_all_labels():
    index: dict = {}
    for fields in (
        _pod_fields("a", {"app": "iris", "c": "llm"}, "10.0.0.1"),
        _pod_fields("b", {"app": "iris", "c": "llm"}, "10.0.0.2", ready=False),
        _pod_fields("c", {"app": "other", "c": "llm"}, "10.0.0.3"),
        _pod_fields("d", {"app": "iris", "c": "llm"}, "", ready=False),  # no IP yet
        _pod_fields("e", {"app": "iris", "c": "llm"}, "10.0.0.5", deleting=True),
    ):
        for key, ref in index_pod(**fields).items():
            index.setdefault(key, []).append(ref)
    chosen = select_pods(index, "ns", {"app": "iris", "c": "llm"})
    assert chosen == [PodRef("a", "10.0.0.1", True), PodRef("b", "10.0.0.2", False)]
    assert select_pods(index, "other-ns", {"c": "llm"}) == []
    assert select_pods(index, "ns", {"c": "encoder"}) == []
