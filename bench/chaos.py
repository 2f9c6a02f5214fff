"""Faults under steady load, counted: `iris up` supervising its services while one of them
is killed with SIGKILL every few seconds (with `--kv-store redis` the LLM pods also share a KV
store, which is killed in its turn: requests then prefill, and none may hang or be wrong).

Set-up: `iris up` (2 LLM pods, 2 encoders, `--cache redis`) on the tiny random Qwen2-VL
checkpoint, so that a few minutes send enough requests. A fixed set of prompts (text chats,
and chats with one of a few images, so embeddings and prefixes are reused) is first answered
one by one on the undisturbed platform: greedy, those answers are the reference. Then
`--clients` clients stream those prompts in random order for `--duration` seconds (pausing
1 s after an error, as a client should) while, every `--kill-every` seconds, one service is
killed at random (an encoder, an LLM pod, the cache service or Redis; every kind once per
round of four, in a random order) and `iris up` brings it back. One fault at a time: a
kill waits until `iris up` has said the last victim serves again.

Every request ends one way:
  complete      [DONE] after an answer equal to the reference (text and finish_reason);
  clean error   an HTTP error with an OpenAI error body, or an SSE error event then [DONE];
  hung          no byte for longer than the stream idle deadline + 5 s;
  wrong         an answer unlike the reference, or an ending that is none of the above
                (a body that is not an OpenAI error, a stream cut without [DONE]).

Printed: each kill, how long until a request of the kind it touched (an image request for
an encoder, the cache or Redis; any request for a pod), sent after the kill, completed, and
when `iris up` said the service served again; then C/N over the requests sent outside the
10 s after each kill, and last `chaos: N requests, completed C, clean errors E, hung H,
wrong W`. Targets: H = 0, W = 0, C/N >= 0.9 outside those windows.

The gateway runs with IRIS_GATEWAY_STREAM_IDLE_S = `--idle-s` and the same acceptance
deadline (IRIS_GATEWAY_ACCEPT_TIMEOUT_S), so a request the platform cannot start within it
is refused (503) rather than left without a byte.

    python bench/chaos.py [--duration 240] [--kill-every 15] [--clients 4] [--idle-s 10]
        [--seed 0] [--model DIR] [--kv-store off|redis]
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import io
import json
import os
import random
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT)]

KILLABLE = ("encoder", "llm", "cache", "redis")
KV_STORE = "kv-store"  # with --kv-store redis: the LLM pods' shared KV store, killed too
WINDOW_S = 10.0  # requests sent this soon after a kill do not count towards C/N
MAX_TOKENS = 8
ERROR_PAUSE_S = 1.0  # a client's pause after an error before its next request


@dataclass(frozen=True)
class Prompt:
    index: int
    text: str
    image: bytes | None  # PNG

    @property
    def kind(self) -> str:
        return "image" if self.image is not None else "text"

    def messages(self) -> list[dict]:
        if self.image is None:
            return [{"role": "user", "content": self.text}]
        url = "data:image/png;base64," + base64.b64encode(self.image).decode()
        content = [
            {"type": "image_url", "image_url": {"url": url}},
            {"type": "text", "text": self.text},
        ]
        return [{"role": "user", "content": content}]


@dataclass(frozen=True)
class Answer:
    text: str
    finish_reason: str | None


@dataclass
class Outcome:
    prompt: Prompt
    sent_at: float
    ended_at: float
    kind: str  # complete | clean | hung | wrong
    detail: str = ""


@dataclass
class Kill:
    at: float
    name: str
    kind: str
    pid: int


@dataclass
class UpProcess:
    """`iris up` as a child process, and the lines it prints (with when they came)."""

    process: subprocess.Popen
    lines: list[tuple[float, str]] = field(default_factory=list)
    url: str | None = None
    ready: threading.Event = field(default_factory=threading.Event)

    def read(self) -> None:
        for line in self.process.stdout:
            self.lines.append((time.monotonic(), line.rstrip()))
            found = re.search(r"Iris is up: (\S+)", line)
            if found:
                self.url = found.group(1)
            if "Ctrl-C to stop" in line:
                self.ready.set()
        self.ready.set()


def make_image(seed: int) -> bytes:
    from PIL import Image

    rng = random.Random(seed)
    size = (64, 48)
    pixels = bytes(rng.randrange(256) for _ in range(size[0] * size[1] * 3))
    buffer = io.BytesIO()
    Image.frombytes("RGB", size, pixels).save(buffer, format="PNG")
    return buffer.getvalue()


def make_prompts(images: int, texts: int) -> list[Prompt]:
    prompts = [Prompt(i, f"Describe picture {i}.", make_image(9000 + i)) for i in range(images)]
    prompts += [Prompt(images + i, f"Tell me about topic number {i}.", None) for i in range(texts)]
    return prompts


async def stream_chat(
    client: httpx.AsyncClient, url: str, model: str, prompt: Prompt
) -> tuple[str, str, Answer | None]:
    """(outcome kind, detail, answer if complete) of one streamed request."""
    body = {
        "model": model,
        "messages": prompt.messages(),
        "max_tokens": MAX_TOKENS,
        "temperature": 0,
        "stream": True,
    }
    try:
        async with client.stream("POST", f"{url}/v1/chat/completions", json=body) as response:
            if response.status_code != 200:
                raw = await response.aread()
                try:
                    error = json.loads(raw)["error"]
                    if error["message"] and error["type"]:
                        return "clean", f"{response.status_code} {error.get('code')}", None
                except (ValueError, KeyError, TypeError):
                    pass
                return "wrong", f"{response.status_code} without an OpenAI error body", None
            text, finish, error, done = [], None, None, False
            async for line in response.aiter_lines():
                if not line.startswith("data: "):
                    continue
                data = line[len("data: ") :]
                if data == "[DONE]":
                    done = True
                    break
                chunk = json.loads(data)
                if "error" in chunk:
                    error = chunk["error"].get("code") or "error"
                    continue
                for choice in chunk.get("choices", []):
                    text.append(choice.get("delta", {}).get("content") or "")
                    finish = choice.get("finish_reason") or finish
            if not done:
                return "wrong", "stream cut without [DONE]", None
            if error is not None:
                return "clean", f"stream error event {error}", None
            return "complete", "", Answer("".join(text), finish)
    except httpx.ReadTimeout:
        return "hung", "no byte within the deadline", None
    except httpx.HTTPError as err:
        return "wrong", f"transport error {type(err).__name__}: {err}", None


async def references(url: str, model: str, prompts: list[Prompt], timeout_s: float):
    """Each prompt's answer on the undisturbed platform, one request at a time."""
    answers = {}
    async with httpx.AsyncClient(timeout=timeout_s) as client:
        for prompt in prompts:
            kind, detail, answer = await stream_chat(client, url, model, prompt)
            if kind != "complete":
                raise SystemExit(f"the undisturbed platform failed prompt {prompt.index}: {detail}")
            answers[prompt.index] = answer
    return answers


async def load(url, model, prompts, reference, clients, until, idle_s, rng) -> list[Outcome]:
    outcomes: list[Outcome] = []
    timeout = httpx.Timeout(connect=5.0, read=idle_s + 5.0, write=5.0, pool=5.0)

    async def client_loop(seed: int) -> None:
        local = random.Random(seed)
        async with httpx.AsyncClient(timeout=timeout) as client:
            while time.monotonic() < until:
                prompt = local.choice(prompts)
                sent = time.monotonic()
                kind, detail, answer = await stream_chat(client, url, model, prompt)
                if kind == "complete" and answer != reference[prompt.index]:
                    kind = "wrong"
                    detail = f"{answer} != reference {reference[prompt.index]}"
                outcomes.append(Outcome(prompt, sent, time.monotonic(), kind, detail))
                if kind == "clean":  # as a client should: wait a moment before retrying
                    await asyncio.sleep(ERROR_PAUSE_S)

    await asyncio.gather(*(client_loop(rng.randrange(1 << 30)) for _ in range(clients)))
    return outcomes


# --- finding and killing services --------------------------------------------------------


def descendants(pid: int) -> list[int]:
    found, stack = [], [pid]
    while stack:
        current = stack.pop()
        for task in Path(f"/proc/{current}/task").glob("*"):
            try:
                children = (task / "children").read_text().split()
            except OSError:
                continue
            for child in map(int, children):
                if child not in found:
                    found.append(child)
                    stack.append(child)
    return found


def service_of(pid: int) -> tuple[str, str] | None:
    """(kind, name) of a service process of `iris up`, from its command line and log."""
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_text().split("\0")
        log = os.readlink(f"/proc/{pid}/fd/1")
    except OSError:
        return None
    name = Path(log).stem
    if any("redis-server" in part for part in argv):  # it rewrites its process title
        return (KV_STORE if name.startswith(KV_STORE) else "redis"), name
    if "iris.cli" in argv:
        kind = argv[argv.index("iris.cli") + 1]
        return kind, name
    return None


def running_services(up_pid: int, killable: tuple[str, ...]) -> list[tuple[int, str, str]]:
    services = []
    for pid in descendants(up_pid):
        found = service_of(pid)
        if found is not None and found[0] in killable:
            services.append((pid, *found))
    return services


async def chaos(
    up: UpProcess, until: float, every_s: float, rng: random.Random, killable: tuple[str, ...]
) -> list[Kill]:
    """Every `every_s`, kill one service at random — a kind drawn from a shuffled round of
    the `killable` kinds, then one of that kind — one fault at a time: the next kill waits
    until `iris up` has said the last victim serves again."""
    kills: list[Kill] = []
    kinds: list[str] = []
    while True:
        if time.monotonic() + every_s >= until - 1:
            return kills
        await asyncio.sleep(every_s)
        while kills and back_after_s(kills[-1], up) is None and time.monotonic() < until:
            await asyncio.sleep(0.2)
        if time.monotonic() >= until - 1:
            return kills
        if not kinds:  # every kind in turn, in a random order each round
            kinds = rng.sample(killable, len(killable))
        wanted = kinds.pop()
        candidates = [c for c in running_services(up.process.pid, killable) if c[1] == wanted]
        if not candidates:
            print(f"no running {wanted} to kill", flush=True)
            continue
        pid, kind, name = rng.choice(candidates)
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            continue
        kills.append(Kill(time.monotonic(), name, kind, pid))


# --- report ------------------------------------------------------------------------------


def recovery_s(kill: Kill, outcomes: list[Outcome]) -> float | None:
    """Seconds from the kill until a request of the kind it touched, sent after it,
    completed."""
    kinds = {"image"} if kill.kind in ("encoder", "cache", "redis") else {"image", "text"}
    ends = [
        o.ended_at
        for o in outcomes
        if o.kind == "complete" and o.sent_at > kill.at and o.prompt.kind in kinds
    ]
    return min(ends) - kill.at if ends else None


def back_after_s(kill: Kill, up: UpProcess) -> float | None:
    """Seconds from the kill until `iris up` said the service served again."""
    for at, line in up.lines:
        if at > kill.at and f"{kill.name} serves again" in line:
            return at - kill.at
    return None


def report(outcomes: list[Outcome], kills: list[Kill], up: UpProcess, started: float) -> bool:
    for kill in kills:
        served = recovery_s(kill, outcomes)
        back = back_after_s(kill, up)
        print(
            f"kill at {kill.at - started:6.1f} s: {kill.name:<10} (pid {kill.pid}); "
            f"{'image' if kill.kind in ('encoder', 'cache', 'redis') else 'any'} requests "
            f"served again after {'never' if served is None else f'{served:.1f} s'}; "
            f"iris up: serves again after {'-' if back is None else f'{back:.1f} s'}"
        )
    for line in (text for _, text in up.lines if "crash loop" in text):
        print(f"iris up: {line}")
    counts = {kind: 0 for kind in ("complete", "clean", "hung", "wrong")}
    for outcome in outcomes:
        counts[outcome.kind] += 1
    for outcome in outcomes:
        if outcome.kind in ("hung", "wrong"):
            print(
                f"  {outcome.kind}: prompt {outcome.prompt.index} sent at "
                f"{outcome.sent_at - started:.1f} s: {outcome.detail}"
            )
    errors: dict[str, int] = {}
    for outcome in outcomes:
        if outcome.kind == "clean":
            errors[outcome.detail] = errors.get(outcome.detail, 0) + 1
    for detail, count in sorted(errors.items(), key=lambda item: -item[1]):
        print(f"  clean errors: {count} x {detail}")
    outside = [o for o in outcomes if not any(0 <= o.sent_at - k.at <= WINDOW_S for k in kills)]
    completed_outside = sum(o.kind == "complete" for o in outside)
    ratio = completed_outside / len(outside) if outside else 0.0
    met = counts["hung"] == 0 and counts["wrong"] == 0 and ratio >= 0.9
    print(
        f"outside {WINDOW_S:.0f} s after each kill: {completed_outside}/{len(outside)} "
        f"completed = {ratio:.3f} (target >= 0.9); {len(kills)} kills; targets "
        f"{'met' if met else 'MISSED'}"
    )
    print(
        f"chaos: {len(outcomes)} requests, completed {counts['complete']}, clean errors "
        f"{counts['clean']}, hung {counts['hung']}, wrong {counts['wrong']}"
    )
    return met


def plot(outcomes: list[Outcome], kills: list[Kill], started: float, model: Path) -> Path:
    """Requests completed and failed per second (by when they ended), each kill marked."""
    from bench.plots import figure, save, stamp

    fig, axes = figure(1, 1, size=(10, 4.8))
    axis = axes[0][0]
    end = max([o.ended_at for o in outcomes] + [started + 1]) - started
    seconds = list(range(int(end) + 1))
    for kind, colour, label in (
        ("complete", "tab:green", "completed"),
        (None, "tab:red", "failed (clean error, hung or wrong)"),
    ):
        per_second = [0] * len(seconds)
        for outcome in outcomes:
            if (outcome.kind == "complete") == (kind == "complete"):
                per_second[min(int(outcome.ended_at - started), len(seconds) - 1)] += 1
        axis.step(seconds, per_second, where="post", color=colour, label=label)
    for index, kill in enumerate(kills):
        axis.axvline(
            kill.at - started, color="black", alpha=0.4, linestyle=":",
            label="kill" if index == 0 else None,
        )  # fmt: skip
        axis.text(kill.at - started, axis.get_ylim()[1] * 0.95, kill.name, rotation=90,
                  fontsize=7, va="top")  # fmt: skip
    axis.set_xlabel("seconds since the faults started")
    axis.set_ylabel("requests per second")
    axis.set_title("chaos: requests completed and failed per second, kills marked")
    axis.grid(True, alpha=0.3)
    axis.legend(fontsize=8, loc="upper right")
    stamp(fig, model)
    return save(fig, "chaos.png")


def start_up(model: Path, log_dir: Path, idle_s: float, kv_store: str) -> UpProcess:
    env = {
        **os.environ,
        "PYTHONUNBUFFERED": "1",
        "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""),
        "IRIS_GATEWAY_STREAM_IDLE_S": str(idle_s),
        "IRIS_GATEWAY_ACCEPT_TIMEOUT_S": str(idle_s),
    }
    argv = [sys.executable, "-m", "iris.cli", "up", "--model", str(model), "--llm-pods", "2"]
    argv += ["--encoders", "2", "--cache", "redis", "--log-dir", str(log_dir)]
    argv += ["--kv-store", kv_store]
    process = subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env
    )
    up = UpProcess(process)
    threading.Thread(target=up.read, daemon=True).start()
    return up


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=None, help="default: the tiny Qwen2-VL")
    parser.add_argument("--duration", type=float, default=240.0, help="seconds of faults")
    parser.add_argument("--kill-every", type=float, default=15.0, help="seconds between kills")
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--idle-s", type=float, default=10.0, help="stream idle deadline")
    parser.add_argument("--images", type=int, default=6, help="prompts with an image")
    parser.add_argument("--texts", type=int, default=6, help="text-only prompts")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--kv-store", choices=["off", "redis"], default="off",
        help="redis: the LLM pods share a KV store (iris up --kv-store redis), killed in turn",
    )  # fmt: skip
    args = parser.parse_args()
    killable = KILLABLE + ((KV_STORE,) if args.kv_store == "redis" else ())

    if args.model is None:
        from iris.models.build import cached_tiny

        home = Path(os.environ.get("IRIS_HOME", "~/.cache/iris")).expanduser()
        args.model = cached_tiny("qwen2_vl", home / "bench")
    rng = random.Random(args.seed)
    log_dir = Path(tempfile.mkdtemp(prefix="iris-chaos-"))
    up = start_up(args.model, log_dir, args.idle_s, args.kv_store)
    print(f"iris up: logs in {log_dir}")
    try:
        up.ready.wait(600)
        if up.url is None or up.process.poll() is not None:
            tail = "\n".join(text for _, text in up.lines[-20:])
            raise SystemExit(f"iris up did not start:\n{tail}")
        model = args.model.name
        prompts = make_prompts(args.images, args.texts)
        reference = asyncio.run(references(up.url, model, prompts, 120.0))
        print(f"reference answers for {len(prompts)} prompts from the undisturbed platform")
        started = time.monotonic()
        until = started + args.duration

        async def run():
            killing = asyncio.create_task(chaos(up, until, args.kill_every, rng, killable))
            outcomes = await load(
                up.url, model, prompts, reference, args.clients, until, args.idle_s, rng
            )
            return outcomes, await killing

        outcomes, kills = asyncio.run(run())
        met = report(outcomes, kills, up, started)
        print(f"wrote {plot(outcomes, kills, started, args.model)}")
    finally:
        up.process.send_signal(signal.SIGINT)
        try:
            up.process.wait(60)
        except subprocess.TimeoutExpired:
            up.process.kill()
    sys.exit(0 if met else 1)


if __name__ == "__main__":
    main()
