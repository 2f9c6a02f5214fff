"""Near-limit and over-limit grammars, one case at a time: how each is answered, how fast.

One platform (`iris up` processes) on the demo checkpoint by default (SmolLM2's 49k-token
vocabulary: what a newcomer's `iris up` serves, and where compiles cost the most), or
`--model`. Each case is a chat request whose constraint sits at or over the gateway's
static limits (gateway/api/grammar_limits.py): repetition bounds at 1,000, nested bounds
summed near 100,000, 1,000-value enums and alternations, EBNF. Every answer must be a 200
whose text matches, or a 400 in OpenAI's error shape, within `--bound-s` (5 s). Printed:
one line per case (seconds, status, the start of the answer or the error), then
`grammar cases: worst S s of N, all answered within B s: yes|no`. `--concurrency 4` sends
them four at a time (compile slots are then shared).

    python bench/grammar_cases.py [--model DIR] [--concurrency 1] [--bound-s 5]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import sys
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT)]

from iris.up.platform import Platform, UpConfig  # noqa: E402


def _schema(schema: dict) -> dict:
    named = {"name": "x", "schema": schema}
    return {"response_format": {"type": "json_schema", "json_schema": named}}


def cases() -> list[tuple[str, dict, str | None]]:
    """(name, constraint fields, a regex the text of a 200 must match in full, if any)."""
    three = "(.{1,1000}){1,33}" * 3
    alternation = "(" + "|".join(f"w{i}[a-z]{{1,99}}" for i in range(1000)) + ")"
    ebnf = "root ::= " + " ".join("[a-z]{1,1000}" for _ in range(100))
    strings = {f"p{i}": {"type": "string", "maxLength": 1000} for i in range(100)}
    enum = {"enum": [f"value-{i}" for i in range(1000)]}
    long_items = {"type": "array", "maxItems": 100, "items": {"type": "string", "maxLength": 1001}}
    return [
        ("regex, one bound at 1,000", {"guided_regex": "[a-z]{1,1000}"}, "[a-z]{1,1000}"),
        ("regex, three nested bounds summing to 99,000", {"guided_regex": three}, None),
        ("regex, 1,000 alternatives", {"guided_regex": alternation}, alternation),
        ("EBNF, 100 bounds at 1,000", {"guided_grammar": ebnf}, None),
        (
            "schema, 100 strings of 1,000",
            _schema({"type": "object", "properties": strings}),
            None,
        ),
        ("schema, a 1,000-value enum", _schema(enum), None),
        ("schema, pattern at 1,000", _schema({"type": "string", "pattern": "[a-z]{1,1000}"}), None),
        ("over: one bound at 12,000", {"guided_regex": "[a-z]{1,12000}"}, None),
        ("over: nested bounds at 100,100", {"guided_regex": "(.{1,1000}){1,100}x{1,100}"}, None),
        (
            "over: array of 100 strings of 1,001",
            _schema(long_items),
            None,
        ),
    ]


def _well_formed(response: httpx.Response, pattern: str | None) -> tuple[bool, str]:
    body = response.json()
    if response.status_code == 400:
        error = body.get("error") or {}
        ok = isinstance(error.get("message"), str) and error.get("type") == "invalid_request_error"
        return ok, error.get("message", "")
    if response.status_code != 200:
        return False, json.dumps(body)[:200]
    text = body["choices"][0]["message"]["content"]
    if pattern is not None and not re.fullmatch(pattern, text, re.DOTALL):
        return False, f"text does not match: {text[:80]!r}"
    return True, text


async def run(url: str, model: str, concurrency: int, bound_s: float) -> bool:
    gate = asyncio.Semaphore(concurrency)
    results = []

    async def one(client, name, fields, pattern):
        body = {
            "model": model,
            "messages": [{"role": "user", "content": "Go."}],
            "max_tokens": 16,
            "temperature": 0,
            **fields,
        }
        async with gate:
            started = time.perf_counter()
            response = await client.post(f"{url}/v1/chat/completions", json=body)
            seconds = time.perf_counter() - started
        ok, shown = _well_formed(response, pattern)
        results.append((seconds, ok))
        print(f"{seconds:6.2f} s  {response.status_code}  {name}: {shown[:90]}", flush=True)

    async with httpx.AsyncClient(timeout=120) as client:
        await asyncio.gather(*(one(client, *case) for case in cases()))
    worst = max(seconds for seconds, _ in results)
    good = all(ok for _, ok in results) and worst <= bound_s
    print(
        f"grammar cases: worst {worst:.2f} s of {len(results)}, all answered within "
        f"{bound_s:g} s: {'yes' if good else 'no'}"
    )
    return good


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, default=None, help="default: the demo model")
    parser.add_argument("--concurrency", type=int, default=1)
    parser.add_argument("--bound-s", type=float, default=5.0)
    args = parser.parse_args()
    model = args.model
    if model is None:
        from iris.models import make_demo
        from iris.up.cli import default_demo_dir

        model = default_demo_dir()
        make_demo(model)
    with Platform(UpConfig(model_dir=model)) as platform:
        asyncio.run(run(platform.gateway_url, Path(model).name, args.concurrency, args.bound_s))


if __name__ == "__main__":
    main()
