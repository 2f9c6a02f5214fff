"""Hostile grammars, measured side by side in one run: does one client's near-limit
constraints slow another client's ordinary structured output?

One platform (`iris up` processes) on the tiny random Qwen2-VL checkpoint (or `--model`;
the demo checkpoint's 49k-token vocabulary makes compiles costlier). A well-behaved client
sends streamed chat requests with a few ordinary JSON schemas (compiled once, then cached,
as a real application's are), one after another. Each of `--rounds` rounds has three phases,
side by side, so that drift in the machine's load falls on both:

1. unloaded: the client alone, `--requests` requests;
2. ordinary load: a second client sends the attack's 20 pod-bound requests with ordinary
   (already compiled) schemas instead of its constraints: what a second structured-output
   client costs whatever its grammars, the bound under which the attack cannot go;
3. under attack: the second client sends 20 distinct near-limit constraints (regexes and
   schemas with repetition bounds just under the gateway's limit, every one a fresh
   compile: no round repeats another's numbers) and 4 over the limit (refused at the
   gateway), one after another (`--attackers` at a time).

In phases 2 and 3 only the well-behaved requests sent while the second client's requests
last count. The TTFTs of all rounds are pooled per phase (a p99 over one short phase is its maximum,
which one scheduling hiccup sets). Printed last:
`grammar: well-behaved structured TTFT p99 under attack / unloaded = R` (target R <= 2).
`measure_grammar` is the section a bench registry (bench/hostile.py) calls with a running
platform.

    python bench/hostile_grammar.py [--model DIR] [--rounds 20] [--requests 30] [--attackers 1]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path

import httpx
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT)]

from iris.up.platform import Platform, UpConfig  # noqa: E402

TIMEOUT_S = 300.0
ORDINARY = [
    {
        "type": "object",
        "properties": {"city": {"type": "string", "maxLength": 20}, "ok": {"type": "boolean"}},
        "required": ["city", "ok"],
    },
    {
        "type": "object",
        "properties": {"n": {"type": "integer"}, "tags": {"type": "array", "maxItems": 3}},
        "required": ["n"],
    },
    {"type": "object", "properties": {"answer": {"enum": ["yes", "no", "maybe"]}}},
]


def near_limit(index: int) -> dict:
    """The attacker's index-th constraint: distinct, just under the default limits (index
    below 400)."""
    bound = 1000 - index
    shapes = [
        {"type": "string", "pattern": f"[a-z]{{1,{bound}}}"},
        {"type": "string", "pattern": f"([a-z0-9]{{1,{bound // 10}}}-){{1,9}}"},
        {"type": "string", "minLength": bound // 2, "maxLength": bound},
        {
            "type": "array",
            "maxItems": 90 - index % 80,
            "items": {"type": "string", "maxLength": bound},
        },
    ]
    return shapes[index % len(shapes)]


def structured_body(model: str, schema: dict, name: str, stream: bool, max_tokens: int) -> dict:
    return {
        "model": model,
        "messages": [{"role": "user", "content": "Answer in JSON."}],
        "response_format": {"type": "json_schema", "json_schema": {"name": name, "schema": schema}},
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": stream,
    }


async def ttft(client: httpx.AsyncClient, url: str, body: dict) -> float:
    started = time.perf_counter()
    async with client.stream("POST", f"{url}/v1/chat/completions", json=body) as response:
        if response.status_code != 200:
            text = (await response.aread()).decode(errors="replace")
            raise RuntimeError(f"well-behaved request refused {response.status_code}: {text}")
        async for line in response.aiter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                event = json.loads(line[6:])
                for choice in event.get("choices", []):
                    if (choice.get("delta") or {}).get("content"):
                        return time.perf_counter() - started
    return time.perf_counter() - started


async def well_behaved(client, url: str, model: str, requests: int) -> list[float]:
    times = []
    for i in range(requests):
        body = structured_body(model, ORDINARY[i % len(ORDINARY)], f"ok{i % 3}", True, 16)
        times.append(await ttft(client, url, body))
    return times


def attack_bodies(model: str, first: int) -> list[dict]:
    """20 near-limit constraints (near_limit(first) onwards) and 4 over the limit."""
    bodies = [structured_body(model, near_limit(first + i), f"a{i}", False, 2) for i in range(20)]
    for i in range(4):
        over = {"type": "string", "pattern": f"[a-z]{{1,{12000 + first + i}}}"}
        bodies.append(structured_body(model, over, f"over{i}", False, 2))
    return bodies


def ordinary_bodies(model: str) -> list[dict]:
    """The attack's 20 pod-bound requests with ordinary, compiled schemas (as long)."""
    return [
        structured_body(model, ORDINARY[i % len(ORDINARY)], f"ok{i % 3}", False, 2)
        for i in range(20)
    ]


async def send_all(client, url: str, bodies: list[dict], concurrency: int) -> dict[int, int]:
    """POST every body, `concurrency` at a time; the statuses seen, counted."""
    statuses: dict[int, int] = {}
    gate = asyncio.Semaphore(concurrency)

    async def send(body):
        async with gate:
            response = await client.post(f"{url}/v1/chat/completions", json=body)
            statuses[response.status_code] = statuses.get(response.status_code, 0) + 1

    await asyncio.gather(*(send(body) for body in bodies))
    return statuses


async def while_sending(good, bad, url: str, model: str, bodies, concurrency: int):
    """The well-behaved client's TTFTs for the requests it sends while `bad` sends
    `bodies`, and the statuses `bad` saw."""
    sending = asyncio.create_task(send_all(bad, url, bodies, concurrency))
    times = []
    while not sending.done():
        times += await well_behaved(good, url, model, 1)
    return times, await sending


def _line(name: str, times: list[float]) -> str:
    return (
        f"grammar: {name} structured TTFT p50 {np.median(times) * 1000:.1f} ms, "
        f"p99 {np.percentile(times, 99) * 1000:.1f} ms ({len(times)} requests)"
    )


async def measure_grammar(
    url: str, model: str, rounds: int = 20, requests: int = 30, attackers: int = 1
) -> float:
    """The grammar section: prints its lines and returns R (p99 under attack / unloaded).
    Each round also sends the attack's traffic with ordinary schemas (`ordinary load`): the
    share of the slowdown that is a second client's load, not its grammars."""
    limits = httpx.Timeout(TIMEOUT_S)
    phases: dict[str, list[float]] = {"unloaded": [], "ordinary load": [], "under attack": []}
    statuses: dict[int, int] = {}
    async with httpx.AsyncClient(timeout=limits) as good, httpx.AsyncClient(timeout=limits) as bad:
        await well_behaved(good, url, model, len(ORDINARY))  # compile the ordinary schemas
        for round_ in range(rounds):
            phases["unloaded"] += await well_behaved(good, url, model, requests)
            ordinary = ordinary_bodies(model)
            times, _ = await while_sending(good, bad, url, model, ordinary, attackers)
            phases["ordinary load"] += times
            bodies = attack_bodies(model, 20 * round_)
            times, seen = await while_sending(good, bad, url, model, bodies, attackers)
            phases["under attack"] += times
            for status, count in seen.items():
                statuses[status] = statuses.get(status, 0) + count
    for name, times in phases.items():
        print(_line(name, times))
    print(
        f"grammar: {rounds} rounds, {attackers} attack request(s) at a time; "
        f"attacker's answers by status {dict(sorted(statuses.items()))}"
    )
    base = np.percentile(phases["unloaded"], 99)
    bound = np.percentile(phases["ordinary load"], 99) / base
    print(f"grammar: well-behaved structured TTFT p99 under ordinary load / unloaded = {bound:.2f}")
    ratio = np.percentile(phases["under attack"], 99) / base
    print(f"grammar: well-behaved structured TTFT p99 under attack / unloaded = {ratio:.2f}")
    return ratio


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, default=None, help="default: tiny Qwen2-VL")
    parser.add_argument("--rounds", type=int, default=20, help="unloaded / attack rounds")
    parser.add_argument("--requests", type=int, default=30, help="unloaded requests a round")
    parser.add_argument("--attackers", type=int, default=1, help="attack requests at a time")
    args = parser.parse_args()
    model = args.model
    if model is None:
        from iris.models.build import cached_tiny

        model = cached_tiny("qwen2_vl", ROOT / ".cache" / "models")
    config = UpConfig(model_dir=model, llm_pods=1, encoders=1, torch_threads=1)
    with Platform(config) as platform:
        print(f"platform up at {platform.gateway_url}", flush=True)
        asyncio.run(
            measure_grammar(
                platform.gateway_url, Path(model).name, args.rounds, args.requests, args.attackers
            )
        )


if __name__ == "__main__":
    main()
