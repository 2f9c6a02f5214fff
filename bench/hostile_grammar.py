"""Hostile grammars, measured side by side in one run: does one client's near-limit
constraints slow another client's ordinary structured output?

One platform (`iris up` processes) on the tiny random Qwen2-VL checkpoint (or `--model`;
the demo checkpoint's 49k-token vocabulary makes compiles costlier). A well-behaved client
sends streamed chat requests with a few ordinary JSON schemas (compiled once, then cached,
as a real application's are), one after another:

1. unloaded: alone; its TTFT p99 is the reference;
2. under attack: while an attacker sends 20 distinct near-limit constraints (regexes and
   schemas with repetition bounds just under the gateway's limit, every one a fresh
   compile), several at a time, and a few over the limit (refused at the gateway).

Printed last: `grammar: well-behaved structured TTFT p99 under attack / unloaded = R`
(target R <= 2). `measure_grammar` is the section a bench registry (bench/hostile.py) calls
with a running platform.

    python bench/hostile_grammar.py [--model DIR] [--requests 60] [--attackers 4]
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
    """The attacker's index-th constraint: distinct, just under the default limits."""
    bound = 1000 - index
    shapes = [
        {"type": "string", "pattern": f"[a-z]{{1,{bound}}}"},
        {"type": "string", "pattern": f"([a-z0-9]{{1,{bound // 10}}}-){{1,9}}"},
        {"type": "string", "minLength": bound // 2, "maxLength": bound},
        {"type": "array", "maxItems": 90 - index, "items": {"type": "string", "maxLength": bound}},
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


async def attack(client, url: str, model: str, concurrency: int) -> dict[int, int]:
    """20 near-limit constraints and 4 over the limit, `concurrency` at a time; the
    statuses seen, counted."""
    bodies = [structured_body(model, near_limit(i), f"a{i}", False, 2) for i in range(20)]
    for i in range(4):
        over = {"type": "string", "pattern": f"[a-z]{{1,{12000 + i}}}"}
        bodies.append(structured_body(model, over, f"over{i}", False, 2))
    statuses: dict[int, int] = {}
    gate = asyncio.Semaphore(concurrency)

    async def send(body):
        async with gate:
            response = await client.post(f"{url}/v1/chat/completions", json=body)
            statuses[response.status_code] = statuses.get(response.status_code, 0) + 1

    await asyncio.gather(*(send(body) for body in bodies))
    return statuses


async def measure_grammar(url: str, model: str, requests: int = 60, attackers: int = 4) -> float:
    """The grammar section: prints its lines and returns R (p99 under attack / unloaded)."""
    limits = httpx.Timeout(TIMEOUT_S)
    async with httpx.AsyncClient(timeout=limits) as good, httpx.AsyncClient(timeout=limits) as bad:
        await well_behaved(good, url, model, len(ORDINARY))  # compile the ordinary schemas
        unloaded = await well_behaved(good, url, model, requests)
        attacked_task = asyncio.create_task(attack(bad, url, model, attackers))
        under_attack = []
        while not attacked_task.done() or len(under_attack) < requests:
            under_attack += await well_behaved(good, url, model, 1)
        statuses = await attacked_task
    base, loaded = np.percentile(unloaded, 99), np.percentile(under_attack, 99)
    print(f"grammar: unloaded structured TTFT p99 {base * 1000:.1f} ms ({len(unloaded)} requests)")
    print(
        f"grammar: under attack TTFT p99 {loaded * 1000:.1f} ms ({len(under_attack)} requests);"
        f" attacker's answers by status {dict(sorted(statuses.items()))}"
    )
    ratio = loaded / base
    print(f"grammar: well-behaved structured TTFT p99 under attack / unloaded = {ratio:.2f}")
    return ratio


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, default=None, help="default: tiny Qwen2-VL")
    parser.add_argument("--requests", type=int, default=60, help="per phase, at least")
    parser.add_argument("--attackers", type=int, default=4, help="attack requests at a time")
    args = parser.parse_args()
    model = args.model
    if model is None:
        from iris.models.build import cached_tiny

        model = cached_tiny("qwen2_vl", ROOT / ".cache" / "models")
    config = UpConfig(model_dir=model, llm_pods=1, encoders=1, torch_threads=1)
    with Platform(config) as platform:
        print(f"platform up at {platform.gateway_url}", flush=True)
        asyncio.run(
            measure_grammar(platform.gateway_url, Path(model).name, args.requests, args.attackers)
        )


if __name__ == "__main__":
    main()
