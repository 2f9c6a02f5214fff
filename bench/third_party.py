"""Iris measured by the field's own load generators, aiperf and guidellm, side by side over
three platforms started in this run, with the ratios between them.

The modes are bench/workload.py's (its `up_config`: what `iris up --router R
--embedding-reuse on|off` starts, as processes on loopback, on the demo model):

  (a) prefix-aware routing + embedding reuse   (b) round-robin, no reuse
  (c) round-robin + embedding reuse

The three platforms are started first and stay up together; each workload then runs on
every mode in turn, so that drift on a shared machine lands on every mode alike (the two
platforms not under load stay up meanwhile):

- aiperf, streaming chat with the demo model's tokenizer, synthetic noise images at two
  sizes (`--image-source noise`: every image is new, so no mode can reuse one; what is
  left is routing and the cost of intake), `--noise-requests` each, one at a time, after
  one warm-up request (a fresh platform's first request pays first-call costs);
- aiperf, multi-turn sessions whose images repeat: `--sessions` conversations of
  `--turns` turns from bench/workload.py's plan (the same system prompt, users' own words,
  each session's first turn attaching one of a pool of `--pool` pictures), written as
  aiperf's `multi_turn` custom dataset with the pictures as files; every turn resends the
  history, images included; `--sessions` at a time. (aiperf's own `--image-source assets`
  is 4 built-in pictures resized per request; a custom dataset chooses the pool and the
  sessions, so that is what is used.)
- on (a) only, guidellm's rate sweep (`sweep`: synchronous, throughput, then constant
  rates between; text prompts of `--sweep-prompt-tokens`, `--sweep-requests` a rate).

Printed: each client's own TTFT (p50, p90), inter-token latency (p50), output tokens/s
and requests/s per mode, then (b)/(a) and (c)/(a) for each; then guidellm's sweep. Every
platform and client started here is stopped on the way out (an error, Ctrl-C, SIGTERM).
Sized for about 15 minutes on the shared 2-core machine (the demo's tower: 1.3-10 s a
picture there, depending on the load).

    bash scripts/bench_clients.sh        # .venv-bench with aiperf and guidellm, pinned
    python bench/third_party.py [--pods 2] [--only a,b,c] [--noise-sizes 256x256,512x512]
        [--noise-requests 5] [--sessions 4] [--turns 4] [--pool 3] [--max-tokens 8]
        [--no-guidellm] [--sweep-size 4] [--sweep-requests 6] [--out bench/out/third_party]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import signal
import sys
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT)]

from bench import load_clients as clients  # noqa: E402
from bench.load_clients import Figures  # noqa: E402
from bench.trace import conversations  # noqa: E402
from bench.workload import (  # noqa: E402
    MODES,
    Platform,
    WorkloadShape,
    build_plan,
    image_seed,
    parse_size,
    plan_trace,
    up_config,
)

CLIENT_TIMEOUT_S = 600


def session_conversations(args):
    """The multi-turn sessions: bench/workload.py's plan of `--sessions` users, every
    image from the pool (no uploads), no later images, conversations all at once."""
    shape = WorkloadShape(args.sessions, args.turns, args.pool, upload_share=0.0, later_image=0.0)
    plan = build_plan(shape, seed=0)
    trace = plan_trace(plan, [0.0] * len(plan), args.max_tokens, 0, lambda k: image_seed(k, 0))
    return conversations(trace)


def model_id(url: str) -> str:
    return httpx.get(f"{url}/v1/models", timeout=30).json()["data"][0]["id"]


def start_platforms(args, modes, stack: contextlib.ExitStack) -> dict[str, tuple[str, str]]:
    """Every mode's platform, started one after another and held open by `stack` (which
    stops them all on the way out): {mode: (gateway URL, model id)}."""
    config_args = argparse.Namespace(
        model=args.model, pods=args.pods, gateways=1, extra_env={}
    )  # the workload benchmark's platform, at this run's size
    up = {}
    for key, _, router, reuse in modes:
        started = time.perf_counter()
        platform = stack.enter_context(Platform(up_config(config_args, router, reuse)))
        up[key] = (platform.gateway_url, model_id(platform.gateway_url))
        log(f"[{key}] platform up at {up[key][0]} in {time.perf_counter() - started:.0f} s")
    return up


def run_workloads(args, up: dict[str, tuple[str, str]], sessions: Path) -> dict[str, dict]:
    """Each workload on every mode in turn (drift on a shared machine lands on every mode
    alike), then guidellm on (a): {mode: {workload label: Figures, or a list for guidellm}}."""
    found: dict[str, dict] = {key: {} for key in up}
    runs = [
        (f"noise {w}x{h}", f"aiperf-noise-{w}x{h}", {"noise_size": (w, h)}, args.noise_requests, 1)
        for w, h in args.noise_sizes
    ]
    runs.append(
        (
            f"sessions {args.sessions}x{args.turns}, pool {args.pool}", "aiperf-sessions",
            {"sessions": sessions}, args.sessions * args.turns, args.sessions,
        )
    )  # fmt: skip
    for label, name, workload, requests, concurrency in runs:
        for key, (url, model) in up.items():
            folder = args.out / key / name
            argv = clients.aiperf_argv(
                url, model, args.model, folder, requests=requests, concurrency=concurrency,
                max_tokens=args.max_tokens, **workload,
            )  # fmt: skip
            found[key][label] = timed(key, label, run_aiperf, argv, folder, label)
    if "a" in up and args.guidellm:
        url, model = up["a"]
        found["a"]["guidellm sweep"] = timed("a", "guidellm", run_guidellm, args, url, model)
    return found


def run_aiperf(argv: list[str], folder: Path, label: str) -> Figures:
    clients.run_client(argv, folder / "client.log", CLIENT_TIMEOUT_S)
    return clients.aiperf_figures(folder, label)


def run_guidellm(args, url: str, model: str) -> list[Figures]:
    folder = args.out / "a" / "guidellm"
    folder.mkdir(parents=True, exist_ok=True)
    output = folder / "benchmarks.json"
    scenario = clients.guidellm_scenario(
        url, model, args.model, output, sweep_size=args.sweep_size,
        requests_per_rate=args.sweep_requests, prompt_tokens=args.sweep_prompt_tokens,
        max_tokens=args.max_tokens,
    )  # fmt: skip
    (folder / "scenario.json").write_text(json.dumps(scenario, indent=1))
    clients.run_client(
        clients.guidellm_argv(folder / "scenario.json"), folder / "client.log", CLIENT_TIMEOUT_S
    )
    return clients.guidellm_figures(output)


def timed(key: str, label: str, run, *run_args):
    """`run(*run_args)`, its time logged."""
    started = time.perf_counter()
    result = run(*run_args)
    log(f"[{key}] {label}: {time.perf_counter() - started:.0f} s")
    return result


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


COLUMNS = ("TTFT p50 ms", "TTFT p90 ms", "ITL p50 ms", "out tok/s", "req/s")


def row(figures: Figures) -> list[float]:
    return [
        figures.ttft_p50_ms,
        figures.ttft_p90_ms,
        figures.itl_p50_ms,
        figures.output_tok_s,
        figures.requests_s,
    ]


def ratio(x: float, y: float) -> str:
    return f"{x / y:.2f}" if y and not math.isnan(x) and not math.isnan(y) else "n/a"


def print_report(results: dict[str, dict], names: dict[str, str]) -> None:
    """aiperf's figures per workload and mode, the ratios against (a), guidellm's sweep."""
    workloads = [label for label in next(iter(results.values())) if label != "guidellm sweep"]
    for label in workloads:
        print(f"\naiperf, {label} (its own figures; streaming chat, demo model):")
        print(f"  {'mode':<28}" + "".join(f"{c:>13}" for c in COLUMNS) + f"{'requests':>10}")
        for key, found in results.items():
            figures = found[label]
            cells = "".join(f"{value:>13.1f}" for value in row(figures))
            print(f"  {names[key]:<28}{cells}{figures.requests:>10}")
        if "a" in results:
            a = row(results["a"][label])
            for key in results:
                if key != "a":
                    other = row(results[key][label])
                    cells = "".join(f"{ratio(o, x):>13}" for o, x in zip(other, a, strict=True))
                    print(f"  {'ratio (' + key + ')/(a)':<28}{cells}")
    sweep = results.get("a", {}).get("guidellm sweep")
    if sweep:
        print(f"\nguidellm rate sweep on {names['a']} (its own figures; text prompts):")
        print(f"  {'strategy':<28}" + "".join(f"{c:>13}" for c in COLUMNS) + f"{'requests':>10}")
        for figures in sweep:
            cells = "".join(f"{value:>13.1f}" for value in row(figures))
            print(f"  {figures.label:<28}{cells}{figures.requests:>10}")


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=None, help="default: the demo model")
    parser.add_argument("--pods", type=int, default=2, help="LLM pods per platform")
    parser.add_argument("--only", default="a,b,c", help="modes to run (of a, b, c)")
    parser.add_argument("--noise-sizes", default="256x256,512x512", help="WxH,WxH")
    parser.add_argument("--noise-requests", type=int, default=5)
    parser.add_argument("--sessions", type=int, default=4, help="multi-turn sessions")
    parser.add_argument("--turns", type=int, default=4, help="turns per session")
    parser.add_argument("--pool", type=int, default=3, help="pictures the sessions share")
    parser.add_argument("--max-tokens", type=int, default=8)
    parser.add_argument("--guidellm", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--sweep-size", type=int, default=4, help="guidellm sweep benchmarks")
    parser.add_argument("--sweep-requests", type=int, default=6, help="requests a benchmark")
    parser.add_argument("--sweep-prompt-tokens", type=int, default=64)
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "out" / "third_party")
    args = parser.parse_args(argv)
    try:
        args.noise_sizes = [parse_size(size) for size in args.noise_sizes.split(",") if size]
    except ValueError as err:
        parser.error(str(err))
    only = [key.strip() for key in args.only.split(",") if key.strip()]
    if not only or set(only) - {"a", "b", "c"}:
        parser.error(f"--only {args.only!r}: modes are a, b, c")
    args.only = only
    for name in ("pods", "noise_requests", "sessions", "turns", "pool", "max_tokens"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1")
    if args.sweep_size < 2 or args.sweep_requests < 1:
        parser.error("--sweep-size must be >= 2 and --sweep-requests >= 1")
    return args


def _stop_on_sigterm(signum, frame) -> None:
    # A plain SIGTERM would end the process with its platforms still up; as an exception
    # it unwinds through every `with Platform` and client run, which stop what they started.
    raise KeyboardInterrupt(f"signal {signum}")


def main(argv=None) -> None:
    args = parse_args(argv)
    if args.model is None:
        from bench.cost_split import demo_dir

        args.model = demo_dir()
    for name in ("aiperf", "guidellm"):
        clients.client_path(name)  # fails early, naming scripts/bench_clients.sh
    signal.signal(signal.SIGTERM, _stop_on_sigterm)
    started = time.perf_counter()
    sessions = clients.write_sessions(session_conversations(args), args.out / "sessions")
    modes = [mode for mode in MODES if mode[0] in args.only]
    names = {key: name for key, name, _, _ in modes}
    with contextlib.ExitStack() as stack:
        results = run_workloads(args, start_platforms(args, modes, stack), sessions)
    print(
        f"model {args.model}; {args.pods} LLM pods a platform; noise images "
        f"{', '.join(f'{w}x{h}' for w, h in args.noise_sizes)}, {args.noise_requests} requests "
        f"each, one at a time; sessions {args.sessions} x {args.turns} turns over a pool of "
        f"{args.pool} pictures, {args.sessions} at a time; max tokens {args.max_tokens}"
    )
    print_report(results, names)
    print(f"\nruntime of this run: {time.perf_counter() - started:.0f} s; outputs in {args.out}")


if __name__ == "__main__":
    try:
        main()
    except KeyboardInterrupt as stop:  # everything started here was stopped on the way out
        log(f"interrupted ({stop or 'Ctrl-C'}): the platforms and clients it started are stopped")
        sys.exit(130)
