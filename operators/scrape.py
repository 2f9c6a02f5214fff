"""Read one pod's load from its Prometheus /metrics over the pod IP.

A pod that does not answer within the timeout, answers with anything but a 200 (redirects
are not followed), sends more than the byte bound, sends a page that does not parse, or
lacks a metric the policy needs or gives it a value that is not a finite number >= 0, is a
failed scrape (`ScrapeError`): the caller counts it and shows it in the status, and the
policy treats that pod as unknown, never as idle nor as loaded.
"""

from __future__ import annotations

import asyncio
import math

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from iris import metrics
from operators.policy import EncoderLoad, LLMLoad


class ScrapeError(Exception):
    """A pod's /metrics could not be read or lacked a required metric."""


def parse_gauges(text: str) -> dict[str, float]:
    """Sum the samples of each metric family (all label sets) in a Prometheus text page."""
    sums: dict[str, float] = {}
    try:
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                sums[sample.name] = sums.get(sample.name, 0.0) + float(sample.value)
    except Exception as err:  # noqa: BLE001 - the parser raises more than ValueError
        raise ScrapeError(f"unparsable metrics page: {type(err).__name__} {err}"[:300]) from None
    return sums


def _require(gauges: dict[str, float], name: str) -> float:
    if name not in gauges:
        raise ScrapeError(f"metric {name} missing")
    value = gauges[name]
    if not math.isfinite(value) or value < 0:
        raise ScrapeError(f"metric {name} = {value} is not a finite number >= 0")
    return value


def llm_load(gauges: dict[str, float]) -> LLMLoad:
    """An LLM pod's load; ScrapeError when one of its three gauges is missing."""
    return LLMLoad(
        kv_utilisation=_require(gauges, metrics.LLM_KV_UTILISATION),
        requests_waiting=_require(gauges, metrics.LLM_REQUESTS_WAITING),
        pending_prefill_tokens=_require(gauges, metrics.LLM_PENDING_PREFILL_TOKENS),
    )


def encoder_load(gauges: dict[str, float]) -> EncoderLoad:
    """An encoder pod's load; queued images is informative only, so it may be absent."""
    return EncoderLoad(
        queued_images=gauges.get(metrics.ENCODER_QUEUED_IMAGES, 0.0),
        queued_vision_tokens=_require(gauges, metrics.ENCODER_QUEUED_VISION_TOKENS),
        busy_ratio=_require(gauges, metrics.ENCODER_BUSY_RATIO),
    )


async def fetch_gauges(
    session: aiohttp.ClientSession, ip: str, port: int, timeout_s: float, max_bytes: int
) -> dict[str, float]:
    """GET http://ip:port/metrics (no redirects, at most `max_bytes`, within `timeout_s`)
    and parse it; any failure is a ScrapeError."""
    host = f"[{ip}]" if ":" in ip else ip  # IPv6 pod IPs
    url = f"http://{host}:{port}/metrics"
    try:
        timeout = aiohttp.ClientTimeout(total=timeout_s)
        async with session.get(url, timeout=timeout, allow_redirects=False) as response:
            if response.status != 200:
                raise ScrapeError(f"{url} answered HTTP {response.status}")
            if (response.content_length or 0) > max_bytes:
                raise ScrapeError(
                    f"{url} announced {response.content_length} bytes, over {max_bytes}"
                )
            body = await response.content.read(max_bytes + 1)
            if len(body) > max_bytes:
                raise ScrapeError(f"{url} sent more than {max_bytes} bytes")
    except (aiohttp.ClientError, TimeoutError) as err:
        raise ScrapeError(f"{url}: {type(err).__name__} {err}") from None
    try:
        text = body.decode()
    except UnicodeDecodeError:
        raise ScrapeError(f"{url} sent a page that is not UTF-8") from None
    return parse_gauges(text)


async def scrape_pool(
    session: aiohttp.ClientSession,
    ips: dict[str, str],
    port: int,
    timeout_s: float,
    read,
    max_bytes: int = 1 << 20,
) -> tuple[list, dict[str, str]]:
    """Scrape every pod of `ips` (name -> IP) at once; `read` turns gauges into a load.

    Returns the loads of the pods that answered and, for the others, name -> why.
    """
    names = sorted(ips)

    async def one(name: str):
        return read(await fetch_gauges(session, ips[name], port, timeout_s, max_bytes))

    results = await asyncio.gather(*(one(name) for name in names), return_exceptions=True)
    loads, failures = [], {}
    for name, result in zip(names, results, strict=True):
        if isinstance(result, ScrapeError):
            failures[name] = str(result)
        elif isinstance(result, BaseException):
            raise result
        else:
            loads.append(result)
    return loads, failures
