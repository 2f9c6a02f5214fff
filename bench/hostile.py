"""The gateway's event loop under hostile requests: does any client stall it?

One platform (`iris up` processes on the tiny random Qwen2-VL checkpoint). Several sender
processes send the heavy requests of every registered section (each class of issue 32:
the largest bodies each route's caps let through to the parser, long lists, big and many
tool schemas, deep nesting, long stop strings, big headers, a 16 MB image body, ...) while
one more client, in this process, probes GET /healthz back to back. A probe's latency is
how long the loop kept it waiting (its quiet median, measured first, is printed beside).

    python bench/hostile.py [--runs 5] [--requests 120] [--senders 3] [--model DIR]
        [--sections bounds,schemas,...] [--env IRIS_GATEWAY_X=Y ...]

Prints first the /healthz median on the quiet gateway; then per run the probes' p99 and
worst lag as multiples of that median (targets: p99 <= 20x, worst <= 60x, in every run),
each body kind's worst probe (and, in the first run, its statuses); last
`hostile: loop lag / quiet median (M ms), p99 A, B, ...; worst C, D, ...; targets ... met in
K of N runs`. A benchmark, not a test: the figures depend on the machine, and want it quiet.

Sections: `SECTIONS` maps a name to a function (model name) -> list of `Heavy`; another
file registers one with one line. `MEASURES` holds the sections that measure on their own
once the loop-lag run is over: `grammar` (bench/hostile_grammar.py) prints
`grammar: well-behaved structured TTFT p99 under attack / unloaded = R`.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import multiprocessing
import os
import statistics
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT)]

from bench.hostile_grammar import measure_grammar  # noqa: E402
from iris.up.platform import Platform, UpConfig  # noqa: E402

CHAT, COMPLETIONS = "/v1/chat/completions", "/v1/completions"


@dataclass
class Heavy:
    """One heavy request: its label, path, body (bytes) and extra headers."""

    label: str
    path: str
    body: bytes
    headers: dict[str, str] = field(default_factory=dict)


def _json(payload) -> bytes:
    return json.dumps(payload, separators=(",", ":")).encode()


def _chat(model: str, messages: list, **fields) -> bytes:
    return _json({"model": model, "messages": messages, **fields})


def _complete(model: str, prompt, **fields) -> bytes:
    return _json({"model": model, "prompt": prompt, **fields})


def bounds(model: str) -> list[Heavy]:
    """Lists and strings at (and over) their bounds: the parse is what costs."""
    letters = [{"role": "user", "content": "a"}] * 4000
    parts = [{"role": "user", "content": [{"type": "text", "text": "a"}] * 8000}]
    huge_text = [{"role": "user", "content": "ipsum " * 2_700_000}]
    stops = {"n": 8, "stop": ["s" * 262_144] * 16}
    bias = {"logit_bias": {str(i): 1 for i in range(120_000)}}
    return [
        Heavy("130k token ids", COMPLETIONS, _complete(model, [7] * 130_000)),
        Heavy("2M token ids (over)", COMPLETIONS, _complete(model, [7] * 2_000_000)),
        Heavy("4000 messages", CHAT, _chat(model, letters, max_tokens=1)),
        Heavy("150k messages (over)", CHAT, _chat(model, letters * 38)),
        Heavy("8000 parts", CHAT, _chat(model, parts)),
        Heavy("4 MB text", COMPLETIONS, _complete(model, "lorem " * 690_000)),
        Heavy("16 MB text", CHAT, _chat(model, huge_text)),
        Heavy("16 x 256 KiB stops, n=8", CHAT, _chat(model, letters[:1], **stops)),
        Heavy("120k logit_bias", CHAT, _chat(model, letters[:1], **bias)),
    ]


def _schema(width: int) -> dict:
    field = {"type": "string", "pattern": "^[a-z]+$", "maxLength": 8}
    properties = {f"p{i}": field for i in range(width)}
    return {"type": "object", "properties": properties, "required": list(properties)}


def schemas(model: str) -> list[Heavy]:
    """Schemas to meta-validate: 128 tools as wide as the object cap allows, a wide
    response_format, the same as guided_json."""
    user = [{"role": "user", "content": "call"}]
    tools = [
        {"type": "function", "function": {"name": f"t{i}", "parameters": _schema(60)}}
        for i in range(128)
    ]
    wide = _schema(900)
    fmt = {"type": "json_schema", "json_schema": {"name": "w", "schema": wide}}
    return [
        Heavy("128 tools x 60 properties", CHAT, _chat(model, user, tools=tools, max_tokens=1)),
        Heavy("wide response_format", CHAT, _chat(model, user, response_format=fmt)),
        Heavy("wide guided_json", COMPLETIONS, _complete(model, "x", guided_json=wide)),
    ]


def nesting(model: str) -> list[Heavy]:
    """Nesting anywhere: tool-call arguments, a schema, the body itself."""
    deep = "[" * 20_000 + "]" * 20_000
    nested = b"[" * 40_000 + b"]" * 40_000
    call = {"id": "c", "type": "function", "function": {"name": "f", "arguments": deep}}
    messages = [{"role": "user", "content": "x"}, {"role": "assistant", "tool_calls": [call]}]
    levels = 400  # 800 JSON levels: past every depth limit, within the JSON parser's
    schema = '{"type":"object","properties":{"a":' * levels + "{}" + "}}" * levels
    fmt = '{"type":"json_schema","json_schema":{"name":"d","schema":' + schema + "}}"
    head = f'{{"model":"{model}","messages":[{{"role":"user","content":"x"}}],'
    return [
        Heavy("arguments 20k deep", CHAT, _chat(model, messages, max_tokens=1)),
        Heavy("schema 800 deep", CHAT, (head + '"response_format":' + fmt + "}").encode()),
        Heavy("body 40k deep", CHAT, b'{"model":"m","messages":' + nested + b"}"),
    ]


def images(model: str) -> list[Heavy]:
    """An image body as large as the chat cap lets through, not an image."""
    junk = base64.b64encode(os.urandom(12 * 1024 * 1024)).decode()
    part = {"type": "image_url", "image_url": {"url": "data:image/png;base64," + junk}}
    return [Heavy("16 MB non-image", CHAT, _chat(model, [{"role": "user", "content": [part]}]))]


def heads(model: str) -> list[Heavy]:
    """Heads at their limits."""
    big = {f"x-filler-{i}": "b" * 1000 for i in range(15)}
    return [Heavy("15 KB of headers", COMPLETIONS, _complete(model, "hi", max_tokens=1), big)]


SECTIONS: dict[str, Callable[[str], list[Heavy]]] = {
    "bounds": bounds,
    "schemas": schemas,
    "nesting": nesting,
    "images": images,
    "heads": heads,
}
# Sections that measure on their own, each on a fresh platform after the loop-lag run:
# name -> async function (gateway URL, model name) that prints its line.
MEASURES: dict[str, Callable] = {"grammar": measure_grammar}  # bench/hostile_grammar.py


def _send(job: tuple[str, list[Heavy], int, int]) -> list[tuple[str, int, float, float]]:
    """One sender process: its share of the heavy requests, in turn; (label, status, start,
    end) with times on the machine's monotonic clock."""
    url, heavies, start, count = job
    results = []
    with httpx.Client(timeout=120) as client:
        for i in range(start, start + count):
            heavy = heavies[i % len(heavies)]
            headers = {"Content-Type": "application/json", **heavy.headers}
            started = time.monotonic()
            try:
                status = client.post(
                    url + heavy.path, content=heavy.body, headers=headers
                ).status_code
            except httpx.HTTPError:
                status = 0
            results.append((heavy.label, status, started, time.monotonic()))
    return results


def _probe(url: str, stop: threading.Event, out: list[float], at: list[float]) -> None:
    with httpx.Client(timeout=60) as client:
        while not stop.is_set():
            started = time.monotonic()
            client.get(url + "/healthz")
            out.append(time.monotonic() - started)
            at.append(started)
            time.sleep(0.005)


def _p(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q / 100 * len(ordered)))]


P99_TARGET, WORST_TARGET = 20, 60  # x the quiet /healthz median


def _quiet_median(url: str, seconds: float = 3.0) -> float:
    """The /healthz median on the gateway with nothing else to do."""
    probes: list[float] = []
    stop = threading.Event()
    timer = threading.Timer(seconds, stop.set)
    timer.start()
    _probe(url, stop, probes, [])
    return statistics.median(probes)


def _lag_run(url: str, heavies: list[Heavy], requests: int, senders: int):
    """One run: the heavy requests from `senders` processes while this one probes;
    (probe latencies, their start times, (label, status, start, end) per request)."""
    share = requests // senders
    jobs = [(url, heavies, s * share, share) for s in range(senders)]
    probes: list[float] = []
    probed_at: list[float] = []
    stop = threading.Event()
    prober = threading.Thread(target=_probe, args=(url, stop, probes, probed_at))
    with multiprocessing.get_context("spawn").Pool(senders) as pool:
        prober.start()
        results = [r for batch in pool.map(_send, jobs) for r in batch]
    stop.set()
    prober.join()
    return probes, probed_at, results


def _report(run: int, quiet: float, probes, probed_at, results, show_kinds: bool) -> bool:
    """Print one run's lag as multiples of the quiet median; whether it met the targets."""
    p99, worst = _p(probes, 99) / quiet, max(probes) / quiet
    met = p99 <= P99_TARGET and worst <= WORST_TARGET
    print(
        f"run {run}: loop lag p99 {_p(probes, 99) * 1000:.1f} ms = {p99:.1f}x, worst "
        f"{max(probes) * 1000:.1f} ms = {worst:.1f}x the quiet median over {len(probes)} "
        f"probes, {len(results)} heavy requests (targets {P99_TARGET}x, {WORST_TARGET}x): "
        f"{'met' if met else 'NOT met'}"
    )
    by_label: dict[str, Counter] = {}
    worst_during: dict[str, float] = {}
    for label, status, started, ended in results:
        by_label.setdefault(label, Counter())[status] += 1
        during = [lag for lag, at in zip(probes, probed_at, strict=True) if started <= at <= ended]
        worst_during[label] = max([worst_during.get(label, 0.0), *during])
    for label in sorted(by_label, key=lambda label: -worst_during[label]):
        worst_ms = worst_during[label] * 1000
        shown = ", ".join(f"{status} x{n}" for status, n in sorted(by_label[label].items()))
        statuses = f"; {shown}" if show_kinds else ""
        print(
            f"    {label}: worst probe {worst_ms:.1f} ms = {worst_ms / 1000 / quiet:.1f}x{statuses}"
        )
    return met


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, default=None, help="default: tiny Qwen2-VL")
    parser.add_argument("--requests", type=int, default=120, help="heavy requests per run")
    parser.add_argument("--senders", type=int, default=3)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--sections", default=",".join([*SECTIONS, *MEASURES]))
    parser.add_argument("--env", action="append", default=[], help="IRIS_GATEWAY_X=Y")
    args = parser.parse_args()
    model = args.model
    if model is None:
        from iris.models.build import cached_tiny

        model = cached_tiny("qwen2_vl", ROOT / ".cache" / "models")
    name = Path(model).name
    wanted = args.sections.split(",")
    heavies = [h for section in wanted if section in SECTIONS for h in SECTIONS[section](name)]
    env = dict(item.split("=", 1) for item in args.env)
    config = UpConfig(model_dir=model, torch_threads=1, extra_env={"gateway": env})
    ratios: list[tuple[float, float, bool]] = []
    with Platform(config) as platform:
        url = platform.gateway_url
        quiet = _quiet_median(url)
        print(f"healthz quiet median {quiet * 1000:.2f} ms")
        for run in range(1, args.runs + 1):
            probes, probed_at, results = _lag_run(url, heavies, args.requests, args.senders)
            met = _report(run, quiet, probes, probed_at, results, show_kinds=run == 1)
            ratios.append((_p(probes, 99) / quiet, max(probes) / quiet, met))
        alive = httpx.get(url + "/healthz").status_code
    for section in wanted:
        if section in MEASURES:  # on a fresh platform: the lag run's leftovers do not count
            with Platform(config) as platform:
                asyncio.run(MEASURES[section](platform.gateway_url, name))
    if not ratios:
        return
    print(
        f"hostile: loop lag / quiet median ({quiet * 1000:.2f} ms), p99 "
        f"{', '.join(f'{p99:.1f}' for p99, _, _ in ratios)}; worst "
        f"{', '.join(f'{worst:.1f}' for _, worst, _ in ratios)}; targets "
        f"<= {P99_TARGET}x / <= {WORST_TARGET}x met in {sum(m for *_, m in ratios)} of "
        f"{len(ratios)} runs; /healthz after: {alive}"
    )


if __name__ == "__main__":
    main()
