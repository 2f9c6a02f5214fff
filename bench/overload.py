"""Overload, measured side by side in one run: the sustainable rate, then 3x that rate.

One platform (`iris up` processes: cache, encoder, LLM pods, gateway) on the tiny random
Qwen2-VL checkpoint, so a phase sends enough requests for a p99 on a shared 2-core box.
Every request is a short greedy streamed text chat with its own prompt; arrivals are open
loop (Poisson at the offered rate: nobody waits for an answer before sending the next).

1. Light rate: its TTFT p99 is the reference.
2. Step the offered rate up (x `--step`) until a step's TTFT p99 exceeds 2x the light p99
   or more than 1 % of its requests are refused; the last step that passed is the
   *sustainable rate* (its p99 the *sustainable p99*).
3. Offer 3x the sustainable rate for `--overload-s` seconds (at least `--requests`).
   Requests above capacity must get 429 with Retry-After at once (gateway/routing/
   capacity.py); the admitted ones keep their TTFT.

Every phase sends at least `--requests` requests. Printed: per phase the offered rate,
admitted throughput, TTFT p50 / p99 of the admitted, refusals (and how fast they came, and
their Retry-After), then the gateway's peak RSS, the admitted throughput ratio (overload
admitted throughput / sustainable rate; target >= 0.9) and last
`overload: admitted p99 / sustainable p99 = R` (target R <= 2).

    python bench/overload.py [--model DIR] [--pods 1] [--light-rate 4] [--step 1.5]
        [--requests 1000] [--overload-s 30] [--max-tokens 8] [--env IRIS_GATEWAY_X=Y ...]

The defaults take about 10-15 minutes on 2 cores.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT)]

from iris.up.platform import Platform, UpConfig  # noqa: E402

REQUEST_TIMEOUT_S = 300.0
MAX_REFUSED_SHARE = 0.01  # a step refusing more than this is not sustained
TOPICS = ["rivers", "bridges", "clocks", "maps", "lamps", "gardens", "trains", "boats"]


@dataclass
class Outcome:
    status: int  # HTTP status; 0 when the request failed without one
    ttft_s: float = 0.0  # to the first token (admitted), or to the answer (refused)
    retry_after: str | None = None
    error: str = ""


@dataclass
class Phase:
    name: str
    rate: float
    seconds: float  # how long requests were being sent
    outcomes: list[Outcome] = field(default_factory=list)

    @property
    def admitted(self) -> list[Outcome]:
        return [o for o in self.outcomes if o.status == 200]

    @property
    def refused(self) -> list[Outcome]:
        return [o for o in self.outcomes if o.status == 429]

    @property
    def failed(self) -> list[Outcome]:
        return [o for o in self.outcomes if o.status not in (200, 429)]

    @property
    def throughput(self) -> float:
        """Admitted requests per second of sending."""
        return len(self.admitted) / self.seconds

    def ttft_p(self, q: float) -> float:
        values = [o.ttft_s for o in self.admitted]
        return float(np.percentile(values, q)) if values else float("inf")

    def refused_share(self) -> float:
        return (len(self.refused) + len(self.failed)) / max(1, len(self.outcomes))

    def describe(self) -> str:
        line = (
            f"{self.name:>12}: offered {self.rate:6.1f}/s for {self.seconds:5.1f} s, "
            f"{len(self.outcomes)} requests, admitted {self.throughput:6.1f}/s, "
            f"TTFT p50 {self.ttft_p(50) * 1000:7.1f} ms p99 {self.ttft_p(99) * 1000:7.1f} ms"
        )
        if self.refused:
            waits = [o.ttft_s for o in self.refused]
            hints = sorted({o.retry_after or "none" for o in self.refused})
            line += (
                f", 429 {len(self.refused)} (answered in p99 "
                f"{np.percentile(waits, 99) * 1000:.1f} ms, Retry-After {', '.join(hints)} s)"
            )
        if self.failed:
            line += f", other errors {len(self.failed)} (first: {self.failed[0].error[:120]})"
        return line


async def one_request(client: httpx.AsyncClient, url: str, model: str, index: int, args):
    topic = TOPICS[index % len(TOPICS)]
    body = {
        "model": model,
        "messages": [{"role": "user", "content": f"Request {index}: one line about {topic}."}],
        "max_tokens": args.max_tokens,
        "temperature": 0,
        "stream": True,
    }
    started = time.perf_counter()
    try:
        async with client.stream("POST", f"{url}/v1/chat/completions", json=body) as response:
            if response.status_code != 200:
                text = (await response.aread()).decode(errors="replace")
                return Outcome(
                    response.status_code,
                    time.perf_counter() - started,
                    response.headers.get("retry-after"),
                    text[:300],
                )
            ttft = None
            async for line in response.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                event = json.loads(line[6:])
                if "error" in event:
                    return Outcome(502, error=json.dumps(event["error"])[:300])
                for choice in event.get("choices", []):
                    delta = choice.get("delta") or {}
                    if ttft is None and "role" not in delta and "content" in delta:
                        ttft = time.perf_counter() - started
            return Outcome(200, ttft if ttft is not None else time.perf_counter() - started)
    except httpx.HTTPError as err:
        return Outcome(0, error=f"{type(err).__name__}: {err}")


async def run_phase(platform, name: str, rate: float, seconds: float, args, rng) -> Phase:
    """Open loop: Poisson arrivals at `rate` for `seconds` (at least args.requests)."""
    count = max(args.requests, int(rate * seconds))
    gaps = [rng.expovariate(rate) for _ in range(count)]
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=256)
    timeout = httpx.Timeout(REQUEST_TIMEOUT_S)
    tasks = []
    async with httpx.AsyncClient(limits=limits, timeout=timeout) as client:
        started = time.perf_counter()
        due = started
        for index, gap in enumerate(gaps):
            due += gap
            delay = due - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            task = one_request(client, platform.gateway_url, args.model_name, index, args)
            tasks.append(asyncio.create_task(task))
        sent_for = time.perf_counter() - started
        outcomes = await asyncio.gather(*tasks)
    phase = Phase(name, rate, sent_for, list(outcomes))
    print(phase.describe(), flush=True)
    return phase


def peak_rss_mib(pid: int) -> float:
    """The process's peak resident set (VmHWM) so far, MiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def parse_env(items: list[str]) -> dict[str, dict[str, str]]:
    """`IRIS_<SVC>_<NAME>=VALUE` → UpConfig.extra_env ({service kind: {key: value}})."""
    kinds = {"GATEWAY": "gateway", "LLM": "llm", "ENCODER": "encoder", "CACHE": "cache"}
    extra: dict[str, dict[str, str]] = {}
    for item in items:
        key, _, value = item.partition("=")
        kind = kinds.get(key.split("_")[1] if key.count("_") >= 2 else "")
        if not key.startswith("IRIS_") or kind is None:
            raise SystemExit(f"--env {item!r}: expected IRIS_<GATEWAY|LLM|ENCODER|CACHE>_NAME=V")
        extra.setdefault(kind, {})[key] = value
    return extra


async def measure(platform, args) -> tuple[Phase, Phase, Phase]:
    rng = random.Random(args.seed)
    warm_up = argparse.Namespace(**{**vars(args), "requests": 20})
    await run_phase(platform, "warm-up", args.light_rate, 5.0, warm_up, rng)
    light = await run_phase(platform, "light", args.light_rate, 0.0, args, rng)
    bound = 2 * light.ttft_p(99)
    sustainable, rate = light, args.light_rate
    while True:
        rate *= args.step
        step = await run_phase(platform, f"step {rate:.1f}/s", rate, 0.0, args, rng)
        if step.ttft_p(99) > bound or step.refused_share() > MAX_REFUSED_SHARE:
            break
        sustainable = step
    over_rate = 3 * sustainable.rate
    overload = await run_phase(platform, "3x overload", over_rate, args.overload_s, args, rng)
    return light, sustainable, overload


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, default=None, help="default: tiny Qwen2-VL")
    parser.add_argument("--pods", type=int, default=1)
    parser.add_argument("--light-rate", type=float, default=4.0)
    parser.add_argument("--step", type=float, default=1.5)
    parser.add_argument("--requests", type=int, default=1000, help="per phase, at least")
    parser.add_argument("--overload-s", type=float, default=30.0)
    parser.add_argument("--max-tokens", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--env", action="append", default=[], help="IRIS_<SVC>_<NAME>=VALUE")
    args = parser.parse_args()
    if args.step <= 1:
        raise SystemExit(f"--step must be > 1, got {args.step}")
    model = args.model
    if model is None:
        from iris.models.build import cached_tiny

        model = cached_tiny("qwen2_vl", ROOT / ".cache" / "models")
    args.model_name = Path(model).name  # the gateway's default served model name
    config = UpConfig(
        model_dir=model, llm_pods=args.pods, encoders=1, torch_threads=1,
        extra_env=parse_env(args.env),
    )  # fmt: skip
    with Platform(config) as platform:
        print(f"platform up at {platform.gateway_url} ({args.pods} LLM pod(s))", flush=True)
        light, sustainable, overload = asyncio.run(measure(platform, args))
        gateway = platform.service("gateway")
        rss = peak_rss_mib(gateway.child.pid)
    print(f"light TTFT p99 {light.ttft_p(99) * 1000:.1f} ms (a step passes within 2x of it)")
    print(
        f"sustainable rate {sustainable.rate:.1f}/s (TTFT p99 {sustainable.ttft_p(99) * 1000:.1f}"
        f" ms); overload offered {overload.rate:.1f}/s"
    )
    print(f"gateway peak RSS {rss:.0f} MiB")
    kept = overload.throughput / sustainable.rate
    print(f"overload: admitted throughput / sustainable rate = {kept:.2f}")
    ratio = overload.ttft_p(99) / sustainable.ttft_p(99)
    print(f"overload: admitted p99 / sustainable p99 = {ratio:.2f}")


if __name__ == "__main__":
    main()
