"""Image-reuse multi-turn chat through the gateway: routing and embedding reuse, each
against a fair baseline in the same run.

The workload is a photo-library assistant used by several people at once:

- Every conversation starts with the same system prompt (about 200 tokens), as every
  request of one application does.
- A conversation has `--turns` turns in the user's own words (up to 12 users, no two
  alike): its first turn attaches an image, a later turn attaches another one with chance
  `--later-image`, the other turns are text follow-ups. Every turn resends the whole
  history, images included, as chat clients do.
- The images are the library's (`--library` shared photos, picked by Zipf popularity, so
  a few are asked about by many users) or the user's own upload (`--upload-share` of all
  images attached, each unique). The counts are fixed by the shape, not drawn per seed.
- The library has been seen before, as a running deployment has seen it: before the
  measured turns each library image is sent once (`--no-warm-up`: a cold platform). The
  uploads are new to the platform, in every mode: they must run the vision tower.
- Conversations start at `--rate` per second (Poisson gaps, scaled to the rate's mean),
  a turn follows the answer to the last one (answers of `--max-tokens`). The rate keeps
  the costliest mode, (b), under saturation on the default shape: its encoder runs every
  image of every request, about 1.2 images a turn, so (b)'s encoder is busy about
  32 x 1.2 x 2 s over 140 s, a half of the time, at 2 s a tile.

Every mode runs in this one process on the same workloads (same plans, images and arrival
times), each on a freshly started platform (`iris up` processes):

  (a) prefix-aware routing + embedding reuse      (b) round-robin, no embedding reuse
  (c) round-robin + embedding reuse               (d) prefix-aware routing, no reuse

"No reuse" is `iris up --embedding-reuse off`: the gateway salts each request's images
with a fresh random salt and encodes them all before the Generate, so no image work is
shared, while text prefixes (the system prompt) are reused as in the other modes; nothing
else about the requests changes. (c)/(a) is what routing wins when every platform reuses
embeddings, (d)/(a) what reuse wins when routing is already good (on first turns whose
image the platform was sent before), (b)/(a) both together.

Reported per mode: TTFT p50 / p90 / p99 (all turns and later turns), TPOT, throughput,
prefix hit rate (cached / prompt tokens, from usage), embedding reuse (images the gateway
did not send to an encoder) and encoder calls; then the ratios against (a), the share of
turns with an image the platform never saw (each pays the tower in every mode: over a
tenth of the turns, (a)'s p90 is one of them), an estimate of what routing can win (the
prefill of the tokens (c) found uncached and (a) did not) and a PNG of the TTFT
distributions under bench/out/. Per mode it also prints the CPU seconds each kind of
service spent and how long the platform's start, the warm-up and the measured turns
took. First, the model's measured cost split (tower per tile, LM prefill per image).

`--rate 0` runs the conversations one after another: each turn's TTFT without queueing or
contention, the floor the loaded figures can be held against.

`--seeds N` runs N workloads (each on fresh platforms) and pools their turns. The pooled
p90 ratio (b)/(a) is printed with a bootstrap interval (conversations resampled), and every
turn (when sent, which pod served it, its tokens and TTFT) is written as JSON beside the PNG.

Each mode's output ends with the median and p90 time per stage of its measured requests
(door, intake and hashing, routing, cache reserve, waiting for the encoder, cache reads,
queue on the pod, prefill, the first token's way back, and TTFT inside the platform), read
from the requests' OpenTelemetry spans: every platform exports them to a receiver in this
process (bench/stages.py says which span each stage is).

The workload is a trace (bench/trace.py: JSONL, one line a turn, with its arrival time,
conversation, turn, text or token count, images by id and size or by path, max tokens;
warm-up turns flagged): the built-in one is built from the shape below (`plan_trace`).
`--make-trace FILE` writes it (the image pool is `--library`, the reuse share
`--reuse-share` = 1 - `--upload-share`, with `--users`, `--turns`, `--later-image`,
`--rate`, `--max-tokens`, `--image-size`, `--seed`) and exits; `--trace FILE` replays a
trace in every mode instead (`--rate 0`: its conversations one after another; any other
rate: at the trace's own times), so a user can replay their traffic's shape without
their data.

`--gateways N` runs N gateways per platform and sends each conversation's turns round-robin
over them. Per mode it prints routing precision (gateway/routing/accuracy.py) and routing
regret (the share of prompt tokens a pod computed while another held them, and those tokens
by reason: gateway/routing/regret.py) beside the embedding reuse. `--goodput` searches
modes (a), (b), (c) for the highest rate within the declared latency SLO instead, and
`--calibrate` measures that SLO (bench/goodput.py; `--quick` for a shape in about 10
minutes). `--kv-pressure` runs many more live conversations than the pods' device KV pools
hold, with think time, under device only, host tier and host tier + store, with `--pods` 1
and 3 in one run (bench/kv_pressure.py; `--quick` for a shape in about 12 minutes).

    python bench/workload.py [--model DIR] [--users 8] [--turns 4] [--rate 0.05] [--pods 3]
        [--library 6] [--upload-share 0.3] [--later-image 0.1] [--no-warm-up]
        [--seeds 1] [--only a,b,c,d] [--env IRIS_LLM_MAX_BATCH_TOKENS=256 ...] [--gateways 1]
        [--goodput [--quick] [--slo-ttft-ms MS] [--slo-tpot-ms MS] [--wall-cap-min 60]]
        [--calibrate [--quick] [--calibration-users 6]] [--kv-pressure [--quick] [--pods N]]
        [--trace FILE | --make-trace FILE [--reuse-share 0.7] [--image-size 384x288]]

The default (32 measured turns a mode, 3 of them with an upload) is sized for the
15-minute budget on the demo model (SmolVLM-256M's tower, one tile an image) on this
2-core machine shared with other work, where the tower takes 1.3 to 3.7 s a tile: 15 to
30 s to start each platform, a warm-up, and about 150 s of measured turns a mode; it
prints its runtime.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import os
import random
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT)]

from bench.stages import format_stages, stages_of, summarise_stages  # noqa: E402
from bench.trace import (  # noqa: E402
    Conversation,
    TraceImage,
    TraceTurn,
    conversations,
    filler_text,
    image_table,
    read_trace,
    synthetic_png,
    write_trace,
)
from iris.up.platform import Platform, UpConfig  # noqa: E402
from iris.up.span_receiver import SpanReceiver  # noqa: E402

SYSTEM_PROMPT = (
    "You are Iris, a careful assistant for a photo library. Describe what you see plainly, "
    "name colours and shapes, say when you are unsure, and keep answers short. "
) * 6
QUESTIONS = [
    "What is in this picture?",
    "What colours stand out?",
    "Is there anything unusual here?",
    "Describe the shapes you see.",
    "Summarise our conversation so far.",
]
# What each user wants the picture for: real users word their requests their own way, so
# two conversations about one image share the system prompt and the image, not the rest.
PURPOSES = [
    "a school poster",
    "my grandmother's birthday card",
    "a blog post about gardens",
    "a quiz for my class",
    "the cover of a zine",
    "a slide in my talk on colour",
    "a jigsaw puzzle",
    "a wallpaper for my phone",
    "a museum label",
    "my art homework",
    "a print for the hallway",
    "a t-shirt design",
]


def question(user: int, turn: int) -> str:
    """User `user`'s words at `turn`: the turn's question, with what the user wants."""
    return f"{QUESTIONS[turn % len(QUESTIONS)]} (For {PURPOSES[user % len(PURPOSES)]}.)"


@dataclass
class TurnResult:
    user: int | tuple[int, int]  # (seed, user) once pooled over seeds
    turn: int
    ttft_s: float
    total_s: float
    completion_tokens: int
    prompt_tokens: int
    cached_tokens: int
    ok: bool
    sent_s: float = 0.0  # when the turn was sent, from the start of its workload
    pod: str = ""  # the LLM pod that served it (the gateway's X-Iris-Pod header)
    image: str | None = None  # the key of the image this turn attached (L: library, U: upload)


@dataclass
class ModeResult:
    name: str
    turns: list[TurnResult] = field(default_factory=list)
    wall_s: float = 0.0
    encoded_images: float = 0.0
    images_sent: int = 0
    requests_per_pod: list = field(default_factory=list)
    per_seed: list[ModeResult] = field(default_factory=list)
    cpu_s_by_kind: dict[str, float] = field(default_factory=dict)
    # Routing's predictions over the measured turns, every gateway summed: those > 0, and
    # those within a page of the pod's cached tokens (gateway/routing/accuracy.py).
    predicted: float = 0.0
    predicted_within_page: float = 0.0
    # The prompt tokens the pods accepted, and of them the regret tokens by reason: held by
    # another healthy pod than the one chosen (gateway/routing/regret.py).
    routed_prompt_tokens: float = 0.0
    regret_tokens: dict[str, float] = field(default_factory=dict)
    warmed: bool = False  # the library was sent before the measured turns
    warm_up_s: float = 0.0
    warm_images: set = field(default_factory=set)  # the images the warm-up sent
    measured_from_ns: int = 0  # wall clock when the measured turns began (spans after it)
    stages: list[dict] = field(default_factory=list)  # per request (bench/stages.py)


def library_key(index: int) -> str:
    return f"L{index}"


def upload_key(user: int, turn: int) -> str:
    return f"U{user}.{turn}"


def image_seed(key: str, seed: int) -> str:
    """What a plan key's picture is drawn from: a library image is the same in every
    workload (its key alone), a user's upload is its own to the workload (seed) as well."""
    return key if key.startswith("L") else f"{seed}/{key}"


def make_image(key: str, seed: int, size: tuple[int, int] = (384, 288)) -> bytes:
    """The PNG of one plan key's image (see image_seed)."""
    return synthetic_png(image_seed(key, seed), *size)


def zipf_choice(rng: random.Random, n: int, s: float = 1.1) -> int:
    weights = [1.0 / (rank + 1) ** s for rank in range(n)]
    return rng.choices(range(n), weights=weights)[0]


@dataclass(frozen=True)
class WorkloadShape:
    """What the conversations look like (see the module docstring)."""

    users: int
    turns: int
    library: int  # shared images, Zipf popularity
    upload_share: float  # of attached images, the share that are the user's own upload
    later_image: float  # chance that a later turn attaches another image


def build_plan(shape: WorkloadShape, seed: int) -> list[list[str | None]]:
    """Per user, per turn: the key of the image that turn attaches (None: text only).

    Counts are fixed by the shape, not drawn, so every seed has the stated mix: each first
    turn attaches an image; round(later turns x later_image) later turns, picked at random,
    attach another; round(images x upload_share) of all those images, picked at random,
    are the user's own upload, the rest library images by Zipf popularity (a later one
    not already in its conversation)."""
    rng = random.Random(seed)
    later_slots = [(user, turn) for user in range(shape.users) for turn in range(1, shape.turns)]
    slots = [(user, 0) for user in range(shape.users)]
    slots += rng.sample(later_slots, round(len(later_slots) * shape.later_image))
    uploads = set(rng.sample(slots, round(len(slots) * shape.upload_share)))
    plan: list[list[str | None]] = [[None] * shape.turns for _ in range(shape.users)]
    for user, turn in sorted(slots):
        if (user, turn) in uploads:
            plan[user][turn] = upload_key(user, turn)
        else:
            plan[user][turn] = library_image(rng, shape.library, set(plan[user]))
    return plan


def library_image(rng: random.Random, library: int, in_conversation: set) -> str:
    """A library image by popularity, not one the conversation already holds (if it can)."""
    for _ in range(100):
        key = library_key(zipf_choice(rng, library))
        if key not in in_conversation:
            return key
    return key


def image_part(png: bytes) -> dict:
    url = "data:image/png;base64," + base64.b64encode(png).decode()
    return {"type": "image_url", "image_url": {"url": url}}


async def run_turn(client, url, model, messages, max_tokens) -> tuple[float, float, dict, str, str]:
    body = {
        "model": model,
        "messages": messages,
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    started = time.perf_counter()
    ttft, text, usage = None, [], {}
    async with client.stream("POST", f"{url}/v1/chat/completions", json=body) as response:
        pod = response.headers.get("x-iris-pod", "")
        if response.status_code != 200:
            await response.aread()
            raise RuntimeError(f"HTTP {response.status_code}: {response.text[:200]}")
        async for line in response.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            event = json.loads(line[6:])
            if "error" in event:
                raise RuntimeError(event["error"])
            for choice in event.get("choices", []):
                delta = choice.get("delta", {}).get("content")
                if delta:
                    ttft = ttft or time.perf_counter() - started
                    text.append(delta)
            usage = event.get("usage") or usage
    total = time.perf_counter() - started
    return (ttft or total), total, usage, "".join(text), pod


def gateway_for(urls: list[str], user: int, turn: int) -> str:
    """The gateway a turn goes to: round-robin over them, so one user's turns reach
    different gateways (with one gateway, always it)."""
    return urls[(user + turn) % len(urls)]


async def run_conversation(
    index: int, conversation: Conversation, replay: Replay, result: ModeResult, honour_t: bool
) -> None:
    """One conversation of a trace, turn after turn: each turn resends the history (images
    and answers included), and waits for its `t` (unless `honour_t` is off: one
    conversation after another) and for the answer to the turn before it."""
    messages: list[dict] = []
    for turn in conversation.turns:
        if turn.system is not None:
            messages.append({"role": "system", "content": turn.system})
        if honour_t and turn.t is not None:
            await asyncio.sleep(max(0.0, replay.started + turn.t - time.perf_counter()))
        text = turn.text if turn.text is not None else replay.filler(turn.tokens)
        content = [image_part(replay.images[image.key]) for image in turn.images]
        content.append({"type": "text", "text": text})
        messages.append({"role": "user", "content": content})
        # Every image in the history travels again with each turn.
        result.images_sent += sum(
            1
            for message in messages
            if isinstance(message["content"], list)
            for part in message["content"]
            if part["type"] == "image_url"
        )
        image_key = turn.images[0].key if turn.images else None
        sent_s = time.perf_counter() - replay.started
        try:
            url = gateway_for(replay.urls, index, turn.turn)
            ttft, total, usage, answer, pod = await run_turn(
                replay.client, url, replay.model, messages, turn.max_tokens
            )
            details = usage.get("prompt_tokens_details") or {}
            result.turns.append(
                TurnResult(
                    index,
                    turn.turn,
                    ttft,
                    total,
                    usage.get("completion_tokens", 0),
                    usage.get("prompt_tokens", 0),
                    details.get("cached_tokens", 0) or 0,
                    True,
                    sent_s,
                    pod,
                    image_key,
                )
            )
        except Exception as err:  # a failed turn is counted, and the conversation ends
            print(
                f"  conversation {conversation.name} turn {turn.turn} failed: {err}",
                file=sys.stderr,
            )
            result.turns.append(
                TurnResult(index, turn.turn, 0, 0, 0, 0, 0, False, sent_s, image=image_key)
            )
            return
        messages.append({"role": "assistant", "content": answer})


@dataclass
class Replay:
    """What every conversation of one replay shares."""

    client: httpx.AsyncClient
    urls: list[str]
    model: str
    images: dict[str, bytes]  # by TraceImage.key
    tokenizer_dir: Path | None = None
    started: float = 0.0
    _tokenizer: object = None

    def filler(self, tokens: int) -> str:
        """Text of `tokens` tokens of the model (a trace turn given by its length)."""
        if self._tokenizer is None:
            from transformers import AutoTokenizer

            self._tokenizer = AutoTokenizer.from_pretrained(self.tokenizer_dir)
        return filler_text(tokens, self._tokenizer)


def plan_trace(
    plan: list[list[str | None]],
    gaps: list[float],
    max_tokens: int,
    warm_library: int = 0,
    image_id=lambda key: key,
    size: tuple[int, int] = (384, 288),
) -> list[TraceTurn]:
    """The built-in workload as a trace: first the library's warm-up (`warm_library`
    images, each once with the first question, no user's words), then per user a
    conversation starting after the summed `gaps` before it, its turns following the
    answers. `image_id` names a plan key's image in the trace."""

    def images(key: str | None) -> tuple[TraceImage, ...]:
        return () if key is None else (TraceImage(image_id(key), *size),)

    turns = [
        TraceTurn(
            f"warm-up {index}",
            0,
            text=QUESTIONS[0],
            images=images(library_key(index)),
            max_tokens=max_tokens,
            system=SYSTEM_PROMPT,
            warm_up=True,
        )
        for index in range(warm_library)
    ]
    for user, row in enumerate(plan):
        start = sum(gaps[:user])
        for turn, key in enumerate(row):
            turns.append(
                TraceTurn(
                    f"user {user}",
                    turn,
                    t=start if turn == 0 else None,
                    text=question(user, turn),
                    images=images(key),
                    max_tokens=max_tokens,
                    system=SYSTEM_PROMPT if turn == 0 else None,
                )
            )
    return turns


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of one process so far (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def cpu_by_kind(platform: Platform) -> dict[str, float]:
    """CPU seconds so far, summed over each kind's processes (one that exited is skipped)."""
    totals: dict[str, float] = {}
    for service in platform.services:
        if service.child.pid is None:
            continue
        try:
            seconds = cpu_seconds(service.child.pid)
        except (OSError, IndexError, ValueError):
            continue
        totals[service.kind] = totals.get(service.kind, 0.0) + seconds
    return totals


def service_totals(platform: Platform, kind: str, metric: str) -> list[float]:
    """The sum of `metric`'s samples on each service of `kind`, from its /metrics."""
    from iris.up.metrics_page import metrics_url, scrape

    return [
        scrape(metrics_url(service)).get(metric, 0.0)
        for service in platform.services
        if service.kind == kind
    ]


def arrival_gaps(users: int, rate: float, seed: int) -> list[float]:
    """Seconds between one conversation's start and the next: exponential (Poisson
    arrivals), scaled so that their mean is 1/rate exactly. (An unscaled draw of 8 gaps
    can start the conversations twice as fast as the rate says, and push a mode that
    should run under saturation over it.)"""
    if rate == 0 or users < 2:
        return []
    rng = random.Random(7 + seed)
    gaps = [rng.expovariate(rate) for _ in range(users - 1)]
    scale = (users - 1) / rate / sum(gaps)
    return [gap * scale for gap in gaps]


def routing_counts(platform: Platform) -> dict[str, float]:
    """Routing's counters summed over every gateway: `predicted` (requests routed with a
    predicted prefix hit), `within` (those within a page of the pod's cached tokens),
    `prompt` (accepted prompt tokens) and each regret reason's tokens."""
    from gateway.routing.regret import REASONS
    from iris import metrics as names
    from iris.up.metrics_page import metrics_url, scrape

    counts = dict.fromkeys(("predicted", "within", "prompt", *REASONS), 0.0)
    for gateway in (service for service in platform.services if service.kind == "gateway"):
        page = scrape(metrics_url(gateway))
        counts["predicted"] += page.get(names.GATEWAY_ROUTING_PREDICTED, 0.0)
        counts["within"] += page.get(names.GATEWAY_ROUTING_PREDICTED_WITHIN_PAGE, 0.0)
        counts["prompt"] += page.get(names.GATEWAY_ROUTING_PROMPT_TOKENS, 0.0)
        for reason in REASONS:
            by_reason = scrape(metrics_url(gateway), {names.LABEL_REASON: reason})
            counts[reason] += by_reason.get(names.GATEWAY_ROUTING_REGRET_TOKENS, 0.0)
    return counts


async def drive(platform, plan, images, args, name, seed) -> ModeResult:
    """The built-in workload of one seed's `plan` (images by plan key) on `platform`, as a
    trace (plan_trace): arrivals at `args.rate` (0: one conversation after another), the
    library warmed first when `args.warm_up`."""
    gaps = arrival_gaps(len(plan), args.rate, seed)
    trace = plan_trace(plan, gaps, args.max_tokens, args.library if args.warm_up else 0)
    return await drive_trace(platform, trace, images, args, name)


async def drive_trace(platform, trace: list[TraceTurn], images, args, name) -> ModeResult:
    """Replay `trace` on `platform` (images by TraceImage.key): its warm-up conversations
    one after another, then the measured ones at their times (`args.rate` 0: one after
    another); the platform's counters are read around the measured part."""
    result = ModeResult(name)
    groups = conversations(trace)
    warm = [conversation for conversation in groups if conversation.turns[0].warm_up]
    measured = [conversation for conversation in groups if not conversation.turns[0].warm_up]
    async with httpx.AsyncClient(timeout=600) as client:
        model = (await client.get(f"{platform.gateway_url}/v1/models")).json()["data"][0]["id"]
        replay = Replay(client, platform.gateway_urls, model, images, getattr(args, "model", None))
        if warm:
            warm_started = replay.started = time.perf_counter()
            for conversation in warm:  # the first gateway, as a running deployment's traffic
                warm_replay = replace(replay, urls=[platform.gateway_url])
                await run_conversation(0, conversation, warm_replay, ModeResult(name), False)
            result.warm_up_s = time.perf_counter() - warm_started
            result.warmed = True
            result.warm_images = {
                image.key for c in warm for turn in c.turns for image in turn.images
            }
        encoded_before = sum(service_totals(platform, "encoder", "iris_encoder_images_total"))
        routing_before = routing_counts(platform)
        finished_before = service_totals(platform, "llm", "iris_llm_requests_finished_total")
        cpu_before = cpu_by_kind(platform)
        result.measured_from_ns = time.time_ns()
        replay.started = time.perf_counter()
        honour_t = args.rate != 0
        tasks = []
        for index, conversation in enumerate(measured):
            running = run_conversation(index, conversation, replay, result, honour_t)
            if not honour_t:  # one conversation at a time: the platform never queues
                await running
                continue
            tasks.append(asyncio.create_task(running))
        await asyncio.gather(*tasks)
        result.wall_s = time.perf_counter() - replay.started
    result.cpu_s_by_kind = {
        kind: round(seconds - cpu_before.get(kind, 0.0), 1)
        for kind, seconds in cpu_by_kind(platform).items()
    }
    encoded = sum(service_totals(platform, "encoder", "iris_encoder_images_total"))
    result.encoded_images = encoded - encoded_before
    routing = {key: value - routing_before[key] for key, value in routing_counts(platform).items()}
    result.predicted = routing.pop("predicted")
    result.predicted_within_page = routing.pop("within")
    result.routed_prompt_tokens = routing.pop("prompt")
    result.regret_tokens = routing
    finished = service_totals(platform, "llm", "iris_llm_requests_finished_total")
    result.requests_per_pod = [
        int(after - before) for after, before in zip(finished, finished_before, strict=True)
    ]
    return result


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q / 100 * (len(ordered) - 1))))]


def p90_ratio_interval(
    a: ModeResult, b: ModeResult, draws: int = 2000, seed: int = 0
) -> tuple[float, float, float]:
    """Bootstrap of the pooled TTFT p90 ratio (b)/(a): (2.5th percentile, 97.5th percentile,
    share of draws >= 5). Each draw resamples whole conversations with replacement, the same
    ones for both modes (they ran the same plans). Conversations on one platform queue
    together, so they are not independent draws: the interval is a rough guide to how far
    the ratio moves with the workload, not an exact one."""
    turns_a, turns_b = _ttfts_by_conversation(a), _ttfts_by_conversation(b)
    keys = sorted(set(turns_a) & set(turns_b))
    if not keys:
        return float("nan"), float("nan"), float("nan")
    rng = random.Random(seed)
    ratios = []
    for _ in range(draws):
        picked = [rng.choice(keys) for _ in keys]
        p90_a = percentile([x for key in picked for x in turns_a[key]], 90)
        p90_b = percentile([x for key in picked for x in turns_b[key]], 90)
        ratios.append(p90_b / p90_a)
    ratios.sort()
    at_least_5 = sum(ratio >= 5 for ratio in ratios) / draws
    return ratios[int(0.025 * draws)], ratios[int(0.975 * draws) - 1], at_least_5


def _ttfts_by_conversation(result: ModeResult) -> dict:
    groups: dict = {}
    for turn in result.turns:
        if turn.ok:
            groups.setdefault(turn.user, []).append(turn.ttft_s)
    return groups


def turns_by_image_novelty(
    turns: list[TurnResult], warmed: bool, warm_images: set | None = None
) -> tuple[list[TurnResult], list[TurnResult]]:
    """(repeated, new): the turns attaching an image the platform was already sent (by the
    warm-up, if `warmed`: `warm_images`, or the library's images when not given; or by any
    turn of the same workload sent earlier), and those attaching one it never saw (an
    upload, or a library image on a cold platform), which must run the tower in every
    mode. Text-only turns are in neither."""
    seen: dict = {}
    repeated, new = [], []
    for turn in sorted(turns, key=lambda t: (_seed_of(t.user), t.sent_s)):
        if turn.image is None:
            continue
        known = seen.setdefault(_seed_of(turn.user), set())
        warm = turn.image in warm_images if warm_images else turn.image.startswith("L")
        if turn.image in known or (warmed and warm):
            repeated.append(turn)
        else:
            new.append(turn)
        known.add(turn.image)
    return repeated, new


def _user_key(user) -> tuple:
    return tuple(user) if isinstance(user, (tuple, list)) else (0, user)


def _seed_of(user):
    """The workload (seed) a pooled user belongs to; 0 before pooling."""
    return _user_key(user)[0]


def summarise(result: ModeResult) -> dict:
    ok = [t for t in result.turns if t.ok]
    repeated_turns, new_image_turns = turns_by_image_novelty(ok, result.warmed, result.warm_images)
    repeated = [t.ttft_s for t in repeated_turns if t.turn == 0]
    later = [t.ttft_s for t in ok if t.turn > 0]
    ttfts = [t.ttft_s for t in ok]
    tpots = [
        (t.total_s - t.ttft_s) / (t.completion_tokens - 1) for t in ok if t.completion_tokens > 1
    ]
    prompt = sum(t.prompt_tokens for t in ok)
    return {
        "turns_ok": len(ok),
        "turns_failed": len(result.turns) - len(ok),
        "ttft_p50_ms": percentile(ttfts, 50) * 1e3,
        "ttft_p90_ms": percentile(ttfts, 90) * 1e3,
        "ttft_p99_ms": percentile(ttfts, 99) * 1e3,
        "later_ttft_p50_ms": percentile(later, 50) * 1e3,
        "first_turn_ttft_p50_ms": percentile([t.ttft_s for t in ok if t.turn == 0], 50) * 1e3,
        "first_turn_ttft_p90_ms": percentile([t.ttft_s for t in ok if t.turn == 0], 90) * 1e3,
        "repeated_image_first_turns": len(repeated),
        "new_image_turns": len(new_image_turns),
        "new_image_turn_ttft_p50_ms": percentile([t.ttft_s for t in new_image_turns], 50) * 1e3,
        "repeated_image_first_turn_ttft_p50_ms": percentile(repeated, 50) * 1e3,
        "later_ttft_mean_ms": (statistics.fmean(later) * 1e3) if later else float("nan"),
        "tpot_ms": (statistics.fmean(tpots) * 1e3) if tpots else float("nan"),
        "throughput_tok_s": sum(t.completion_tokens for t in ok) / max(result.wall_s, 1e-9),
        "prefix_hit_rate": sum(t.cached_tokens for t in ok) / max(prompt, 1),
        "images_in_requests": result.images_sent,
        "encoder_calls": result.encoded_images,
        "embedding_reuse": 1 - result.encoded_images / max(result.images_sent, 1),
        "routing_precision": result.predicted_within_page / result.predicted
        if result.predicted
        else float("nan"),
        "routing_predicted_hits": result.predicted,
        "routing_regret_share": sum(result.regret_tokens.values()) / result.routed_prompt_tokens
        if result.routed_prompt_tokens
        else float("nan"),
        "routing_regret_tokens_by_reason": {
            reason: int(tokens) for reason, tokens in result.regret_tokens.items()
        },
        "requests_per_pod_per_seed": result.requests_per_pod,
        "wall_s_summed_over_seeds": result.wall_s,
        "cpu_s_by_service_kind_summed_over_seeds": result.cpu_s_by_kind,
    }


def plot(results: list[ModeResult], path: Path, model: Path) -> None:
    """TTFT distribution per mode, first turns (their image is new to the user) apart from
    later turns (history and, mostly, images already seen)."""
    from bench.plots import figure, save, stamp

    fig, axes = figure(1, 2, size=(11, 4.8))
    for axis, title, first in (
        (axes[0][0], "first turns", True),
        (axes[0][1], "later turns", False),
    ):
        for result in results:
            picked = [t for t in result.turns if t.ok and (t.turn == 0) == first]
            values = sorted(t.ttft_s * 1e3 for t in picked)
            if values:
                axis.plot(
                    values,
                    [(i + 1) / len(values) for i in range(len(values))],
                    label=f"{result.name} (n={len(values)})",
                )
        axis.set_xscale("log")
        axis.set_xlabel("TTFT (ms, log scale)")
        axis.set_ylabel("fraction of turns")
        axis.set_title(f"TTFT distribution, {title}")
        axis.grid(True, alpha=0.3)
        axis.legend(fontsize=7)
    stamp(fig, model)
    save(fig, path)


def write_turns(results: list[ModeResult], args, path: Path) -> None:
    """Every turn as JSON (users are [seed, user]), with the arguments of the run."""
    run = {key: str(value) for key, value in vars(args).items()}
    document = {
        "args": run,
        "modes": {result.name: [asdict(turn) for turn in result.turns] for result in results},
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(document, indent=1))


SERVICE_KINDS = ("cache", "encoder", "llm", "gateway")


def parse_env(items: list[str]) -> dict[str, dict[str, str]]:
    """`IRIS_<SVC>_<NAME>=VALUE` items → UpConfig.extra_env ({service kind: {key: value}})."""
    extra_env: dict[str, dict[str, str]] = {}
    for item in items:
        key, sep, value = item.partition("=")
        kind = key.removeprefix("IRIS_").split("_", 1)[0].lower()
        if not sep or not key.startswith("IRIS_") or kind not in SERVICE_KINDS:
            raise ValueError(
                f"--env {item!r}: expected IRIS_<SVC>_<NAME>=VALUE with SVC one of "
                f"{', '.join(kind.upper() for kind in SERVICE_KINDS)}"
            )
        extra_env.setdefault(kind, {})[key] = value
    return extra_env


# The demo's tower takes about a second a tile on a free core and many times that on a busy
# one; with images queued at the one encoder, the default leases (30 s gateway, 60 s
# encoder) and the pods' 30 s embedding wait run out before the image is encoded. A request
# should wait for its image here, not fail: every mode gets these, the most the cache allows
# (a lease of 600 s, a wait of 120 s); --env overrides them.
SLOW_TOWER_ENV = {
    "gateway": {"IRIS_GATEWAY_LEASE_MS": "600000"},
    "encoder": {"IRIS_ENCODER_LEASE_MS": "600000"},
    "llm": {"IRIS_LLM_EMBEDDING_WAIT_S": "120"},
}


def up_config(args, router: str, reuse: bool) -> UpConfig:
    """The platform every mode runs on, with its router and reuse setting."""
    extra_env = {kind: dict(values) for kind, values in SLOW_TOWER_ENV.items()}
    for kind, values in args.extra_env.items():
        extra_env.setdefault(kind, {}).update(values)
    return UpConfig(
        model_dir=args.model,
        llm_pods=args.pods,
        encoders=1,
        gateways=args.gateways,
        router=router,
        embedding_reuse=reuse,
        torch_threads=1,
        # The benchmark records which pod served each turn (X-Iris-Pod, a debug header).
        extra_env={
            **extra_env,
            "gateway": {"IRIS_GATEWAY_DEBUG_POD_HEADER": "true", **extra_env.get("gateway", {})},
        },
    )


def run_one(args, name, router, reuse, label, trace, images) -> ModeResult:
    """One mode on one trace (`label`: which, for the log), on a freshly started platform
    whose services export their spans here: the result carries each measured request's
    time per stage (bench/stages.py)."""
    starting = time.perf_counter()
    with SpanReceiver() as receiver:
        config = replace(up_config(args, router, reuse), otlp_endpoint=receiver.endpoint)
        with Platform(config) as platform:
            print(
                f"[{name}] {label}: platform up at {platform.gateway_url} in "
                f"{time.perf_counter() - starting:.0f} s",
                file=sys.stderr,
            )
            result = asyncio.run(drive_trace(platform, trace, images, args, name))
            result.stages = stages_of(settled_traces(receiver), result.measured_from_ns)
    print(
        f"[{name}] {label}: warm-up {result.warm_up_s:.0f} s, measured turns "
        f"{result.wall_s:.0f} s, mode {time.perf_counter() - starting:.0f} s in all; "
        f"{len(result.stages)} requests' spans",
        file=sys.stderr,
    )
    return result


def settled_traces(receiver: SpanReceiver, quiet_s: float = 1.0, cap_s: float = 15.0) -> dict:
    """The traces received once no span has arrived for `quiet_s` (the services export in
    batches every 200 ms; the last requests' spans are on their way), at most `cap_s`."""
    deadline = time.monotonic() + cap_s
    count, changed = -1, time.monotonic()
    while time.monotonic() < deadline:
        now_count = len(receiver.spans())
        if now_count != count:
            count, changed = now_count, time.monotonic()
        elif time.monotonic() - changed >= quiet_s:
            break
        time.sleep(0.2)
    return receiver.traces()


def add_seed(pooled: ModeResult, seed: int, result: ModeResult) -> None:
    """Pool one seed's result into its mode's (turns keyed (seed, user))."""
    pooled.per_seed.append(result)
    pooled.warmed = result.warmed
    pooled.warm_up_s += result.warm_up_s
    pooled.warm_images |= result.warm_images
    pooled.stages += result.stages
    pooled.turns += [replace(turn, user=(seed, turn.user)) for turn in result.turns]
    pooled.wall_s += result.wall_s
    pooled.encoded_images += result.encoded_images
    pooled.images_sent += result.images_sent
    pooled.predicted += result.predicted
    pooled.predicted_within_page += result.predicted_within_page
    pooled.routed_prompt_tokens += result.routed_prompt_tokens
    for reason, tokens in result.regret_tokens.items():
        pooled.regret_tokens[reason] = pooled.regret_tokens.get(reason, 0) + tokens
    pooled.requests_per_pod += [result.requests_per_pod]
    for kind, seconds in result.cpu_s_by_kind.items():
        pooled.cpu_s_by_kind[kind] = round(pooled.cpu_s_by_kind.get(kind, 0) + seconds, 1)


DEFAULT_SHAPE = WorkloadShape(users=8, turns=4, library=6, upload_share=0.3, later_image=0.1)

MODES = [
    ("a", "(a) prefix + reuse", "prefix", True),
    ("b", "(b) round-robin, no reuse", "round-robin", False),
    ("c", "(c) round-robin + reuse", "round-robin", True),
    ("d", "(d) prefix, no reuse", "prefix", False),
]
# The targets on the default workload: (key, summary field, target) against (a).
TARGETS = [
    ("b", "ttft_p90_ms", 5.0),
    ("c", "ttft_p90_ms", 2.0),
    ("d", "repeated_image_first_turn_ttft_p50_ms", 3.0),
]


def print_mode(result: ModeResult, summary: dict) -> None:
    print(f"{result.name}:")
    for key, value in summary.items():
        print(f"  {key}: {value:.3f}" if isinstance(value, float) else f"  {key}: {value}")
    if len(result.per_seed) > 1:
        p90s = [f"{summarise(one)['ttft_p90_ms']:.0f}" for one in result.per_seed]
        print(f"  ttft_p90_ms per seed: {', '.join(p90s)}")
        per_seed = [summarise(one) for one in result.per_seed]
        for key in ("routing_precision", "routing_regret_share", "embedding_reuse"):
            values = [one[key] for one in per_seed]
            shown = ", ".join(f"{value:.3f}" for value in values)
            print(f"  {key} per seed: {shown}; mean {statistics.fmean(values):.3f}")
    slowest = sorted((t for t in result.turns if t.ok), key=lambda t: -t.ttft_s)[:6]
    print(
        "  slowest turns (user/turn ttft_ms prompt cached): "
        + ", ".join(
            f"{t.user}/{t.turn} {t.ttft_s * 1e3:.0f} {t.prompt_tokens} {t.cached_tokens}"
            for t in slowest
        )
    )
    print(format_stages(summarise_stages(result.stages), len(result.stages)))


def print_ratios(results: dict, summaries: dict, seeds: int) -> None:
    """Each mode against (a): p50, p90, later-turn p50, and the issue's target lines."""
    if "a" not in summaries:
        return
    a = summaries["a"]
    for key in ("b", "c", "d"):
        if key not in summaries:
            continue
        other = summaries[key]
        parts = [
            f"{label} {other[metric] / a[metric]:.2f}"
            for label, metric in (
                ("p50", "ttft_p50_ms"),
                ("p90", "ttft_p90_ms"),
                ("later-turn p50", "later_ttft_p50_ms"),
                ("repeated-image first-turn p50", "repeated_image_first_turn_ttft_p50_ms"),
            )
        ]
        print(f"ratio TTFT ({key})/(a): " + ", ".join(parts))
    for key, metric, target in TARGETS:
        if key in summaries:
            ratio = summaries[key][metric] / a[metric]
            verdict = "met" if ratio >= target else "NOT met"
            print(f"target ({key})/(a) {metric} >= {target:g}: {ratio:.2f} ({verdict})")
    if "b" in results and seeds > 1:
        per_seed = [
            summarise(one_b)["ttft_p90_ms"] / summarise(one_a)["ttft_p90_ms"]
            for one_a, one_b in zip(results["a"].per_seed, results["b"].per_seed, strict=True)
        ]
        print(f"ratio TTFT p90 (b)/(a) per seed: {', '.join(f'{r:.2f}' for r in per_seed)}")
    if "b" in results:
        low, high, at_least_5 = p90_ratio_interval(results["a"], results["b"])
        print(
            f"ratio TTFT p90 (b)/(a), conversations resampled: 95 % in [{low:.2f}, {high:.2f}], "
            f"{at_least_5:.0%} of draws >= 5"
        )


def print_new_image_bound(summaries: dict, split) -> None:
    """What the turns with a never-seen image put on the p90 ratios: such a turn runs the
    tower in every mode, so once they are over a tenth of (a)'s turns, (a)'s p90 is one of
    them (at least a tower call, plus its queue) and no routing or reuse can take it back."""
    if "a" not in summaries:
        return
    a = summaries["a"]
    share = a["new_image_turns"] / max(a["turns_ok"], 1)
    tower_s = split.tower_s if split is not None else float("nan")
    print(
        f"new-image turns in (a): {a['new_image_turns']} of {a['turns_ok']} ({share:.0%}); "
        f"their TTFT p50 {a['new_image_turn_ttft_p50_ms']:.0f} ms against a tower call of "
        f"{tower_s * 1e3:.0f} ms measured alone. "
        + (
            "Over 10 %: (a)'s p90 is such a turn, paid in every mode, so the p90 ratios are "
            "bounded by how many tower calls and how much prefill (b), (c) add to it."
            if share > 0.1
            else "At most 10 %: (a)'s p90 is a turn that reuse and routing serve."
        )
    )


def print_routing_bound(results: dict, summaries: dict, split) -> None:
    """What routing wins here, roughly: the prompt tokens (c) had to prefill that (a) found
    in a pod's prefix cache, priced at the cost split's prefill rate and put on (a)'s p90.
    An estimate to hold the measured (c)/(a) p90 against: it assumes (c)'s slow turns are
    (a)'s plus that prefill, and leaves out that a miss past an image also fetches the
    image's embedding from the cache service."""
    if "a" not in results or "c" not in results or split is None:
        return

    def uncached(result: ModeResult) -> list[int]:
        return [t.prompt_tokens - t.cached_tokens for t in result.turns if t.ok]

    a, c = uncached(results["a"]), uncached(results["c"])
    per_token_s = split.prefill_s / split.image_tokens
    extra_s = max(percentile(c, 90) - percentile(a, 90), 0) * per_token_s
    p90_a_s = summaries["a"]["ttft_p90_ms"] / 1e3
    print(
        f"routing: uncached prompt tokens a turn, p50 / p90, (a) {percentile(a, 50):.0f} / "
        f"{percentile(a, 90):.0f}, (c) {percentile(c, 50):.0f} / {percentile(c, 90):.0f}; at "
        f"the cost split's {per_token_s * 1e3:.1f} ms a token, (c)'s extra prefill at the p90 "
        f"is {extra_s * 1e3:.0f} ms on (a)'s p90 of {p90_a_s * 1e3:.0f} ms: (c)/(a) p90 about "
        f"{(p90_a_s + extra_s) / p90_a_s:.2f} (prefill alone)"
    )


def parse_size(text: str) -> tuple[int, int]:
    """ "WIDTHxHEIGHT" → (width, height)."""
    width, sep, height = text.lower().partition("x")
    if not sep or not width.isdigit() or not height.isdigit():
        raise ValueError(f"--image-size {text!r}: expected WIDTHxHEIGHT, e.g. 384x288")
    if not (16 <= int(width) <= 8192 and 16 <= int(height) <= 8192):
        raise ValueError(f"--image-size {text!r}: each side must be in [16, 8192]")
    return int(width), int(height)


def builtin_trace(args, shape: WorkloadShape, seed: int) -> list[TraceTurn]:
    """The built-in workload of `seed` as a trace (plan_trace). Each image is named by the
    seed string make_image draws it from, so the trace, written out and replayed, sends the
    same pictures: a library image "L3", an upload "0/U5.2"."""
    plan = build_plan(shape, seed)
    gaps = arrival_gaps(len(plan), args.rate, seed)
    warm = args.library if args.warm_up else 0
    return plan_trace(
        plan, gaps, args.max_tokens, warm, lambda key: image_seed(key, seed), args.size
    )


def replay_file(args, modes) -> dict[str, ModeResult]:
    """`--trace`: the file's turns in every mode, each on its own platform."""
    turns = read_trace(args.trace)
    images = image_table(turns, args.trace.parent)
    return {
        key: run_one(args, name, router, reuse, f"trace {args.trace.name}", turns, images)
        for key, name, router, reuse in modes
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=None, help="default: the demo model")
    parser.add_argument("--users", type=int, default=DEFAULT_SHAPE.users)
    parser.add_argument("--turns", type=int, default=DEFAULT_SHAPE.turns)
    parser.add_argument(
        "--rate", type=float, default=0.05,
        help="new conversations per second; 0: one after another (each mode's no-load floor)",
    )  # fmt: skip
    parser.add_argument(
        "--pods", type=int, default=None, help="LLM pods (3; --kv-pressure: 1 and 3 in one run)"
    )
    parser.add_argument(
        "--library", type=int, default=DEFAULT_SHAPE.library,
        help="shared library images (Zipf popularity)",
    )  # fmt: skip
    parser.add_argument(
        "--upload-share", type=float, default=DEFAULT_SHAPE.upload_share,
        help="of the images attached, the share that are the user's own upload (unique), "
        "for every mode",
    )  # fmt: skip
    parser.add_argument(
        "--later-image", type=float, default=DEFAULT_SHAPE.later_image,
        help="chance that a later turn attaches another image",
    )  # fmt: skip
    parser.add_argument(
        "--warm-up", action=argparse.BooleanOptionalAction, default=True,
        help="send the library before the measured turns, as a running deployment has seen "
        "it (--no-warm-up: a cold platform)",
    )  # fmt: skip
    parser.add_argument("--max-tokens", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--seeds", type=int, default=1,
        help="run the workload for this many seeds (seed, seed+1, ...), each on fresh "
        "platforms; percentiles are over all their turns pooled",
    )  # fmt: skip
    parser.add_argument(
        "--only", default="a,b,c,d", help="the modes to run, comma-separated (default all)"
    )
    parser.add_argument(
        "--env", action="append", default=[], metavar="IRIS_<SVC>_<NAME>=VALUE",
        help="a service setting for every mode (repeatable), e.g. IRIS_LLM_MAX_BATCH_TOKENS=256",
    )  # fmt: skip
    parser.add_argument("--png", type=Path, default=ROOT / "bench" / "out" / "workload_ttft.png")
    parser.add_argument(
        "--turns-json", type=Path, default=ROOT / "bench" / "out" / "workload_turns.json",
        help="every turn of every mode (when sent, TTFT, pod, tokens), for a closer look",
    )  # fmt: skip
    parser.add_argument(
        "--gateways", type=int, default=1,
        help="gateways per platform; each conversation's turns go round-robin over them",
    )  # fmt: skip
    traces = parser.add_argument_group("traces (bench/trace.py: the JSONL format)")
    traces.add_argument(
        "--trace", type=Path, default=None,
        help="replay this JSONL trace in every mode instead of the built-in workload "
        "(--rate 0: its conversations one after another, else at the trace's own times)",
    )  # fmt: skip
    traces.add_argument(
        "--make-trace", type=Path, default=None, metavar="FILE",
        help="write the built-in workload of --seed as a trace (its shape: --users, "
        "--turns, --library as the image pool, --upload-share or --reuse-share, "
        "--later-image, --rate, --max-tokens, --image-size, warm-up) and exit",
    )  # fmt: skip
    traces.add_argument(
        "--reuse-share", type=float, default=None,
        help="of the images attached, the share drawn from the pool (1 - --upload-share)",
    )  # fmt: skip
    traces.add_argument(
        "--image-size", default="384x288", help="WIDTHxHEIGHT of the built-in workload's images"
    )
    goodput = parser.add_argument_group("goodput (bench/goodput.py)")
    goodput.add_argument(
        "--goodput", action="store_true",
        help="search each of modes a, b, c for the highest rate within the SLO",
    )  # fmt: skip
    goodput.add_argument(
        "--calibrate", action="store_true",
        help="run modes a, b, c unloaded and print the declared SLO's constants",
    )  # fmt: skip
    goodput.add_argument(
        "--quick", action="store_true",
        help="with --goodput: a shape in about 10 minutes; with --kv-pressure: about 12",
    )  # fmt: skip
    goodput.add_argument(
        "--slo-ttft-ms", type=float, default=None, help="default: the declared SLO's"
    )
    goodput.add_argument(
        "--slo-tpot-ms", type=float, default=None, help="default: the declared SLO's"
    )
    goodput.add_argument(
        "--start-rate", type=float, default=None,
        help="the search's first rate for every mode (default: one conversation in flight "
        "at each mode's declared unloaded pace)",
    )  # fmt: skip
    goodput.add_argument("--point-turns", type=int, default=None, help="turns per point (100)")
    goodput.add_argument("--bisections", type=int, default=None, help="after the bracket (4)")
    goodput.add_argument("--wall-cap-min", type=float, default=None, help="minutes (60)")
    goodput.add_argument("--calibration-users", type=int, default=None, help="(6)")
    goodput.add_argument("--goodput-png", type=Path, default=ROOT / "bench" / "out" / "goodput.png")
    goodput.add_argument(
        "--goodput-json", type=Path, default=ROOT / "bench" / "out" / "goodput_points.json"
    )
    pressure = parser.add_argument_group("KV pressure (bench/kv_pressure.py)")
    pressure.add_argument(
        "--kv-pressure", action="store_true",
        help="many more live conversations than the device pools hold, under each KV tier "
        "setting, with --pods 1 and 3 unless --pods names one",
    )  # fmt: skip
    pressure.add_argument(
        "--kv-pressure-png", type=Path, default=ROOT / "bench" / "out" / "kv_pressure.png"
    )
    args = parser.parse_args()
    if args.pods is not None and args.pods < 1:
        parser.error(f"--pods must be >= 1, got {args.pods}")
    if args.pods is None and not args.kv_pressure:
        args.pods = 3
    if args.gateways < 1:
        parser.error(f"--gateways must be >= 1, got {args.gateways}")
    for name in ("slo_ttft_ms", "slo_tpot_ms", "start_rate", "wall_cap_min"):
        value = getattr(args, name)
        if value is not None and not value > 0:
            parser.error(f"--{name.replace('_', '-')} must be > 0, got {value}")
    for name in ("point_turns", "calibration_users"):
        value = getattr(args, name)
        if value is not None and value < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1, got {value}")
    if args.bisections is not None and args.bisections < 0:
        parser.error(f"--bisections must be >= 0, got {args.bisections}")
    if args.rate < 0:
        parser.error(f"--rate must be >= 0, got {args.rate}")
    if args.seeds < 1:
        parser.error(f"--seeds must be >= 1, got {args.seeds}")
    if args.users < 1 or args.turns < 1 or args.library < 1:
        parser.error("--users, --turns and --library must be >= 1")
    for name in ("upload_share", "later_image"):
        if not 0 <= getattr(args, name) <= 1:
            parser.error(f"--{name.replace('_', '-')} must be in [0, 1], got {getattr(args, name)}")
    try:
        args.extra_env = parse_env(args.env)
        args.size = parse_size(args.image_size)
    except ValueError as err:
        parser.error(str(err))
    if args.reuse_share is not None:
        if not 0 <= args.reuse_share <= 1:
            parser.error(f"--reuse-share must be in [0, 1], got {args.reuse_share}")
        args.upload_share = 1 - args.reuse_share
    if args.trace is not None and (args.goodput or args.calibrate or args.make_trace):
        parser.error("--trace replays a trace: not with --goodput, --calibrate or --make-trace")
    if args.make_trace is not None:
        shape = WorkloadShape(
            args.users, args.turns, args.library, args.upload_share, args.later_image
        )
        write_trace(args.make_trace, builtin_trace(args, shape, args.seed))
        print(f"wrote {args.make_trace}")
        return
    if args.model is None:
        from bench.cost_split import demo_dir

        args.model = demo_dir()
    only = [name.strip() for name in args.only.split(",") if name.strip()]
    unknown = sorted(set(only) - {mode[0] for mode in MODES})
    if unknown or not only:
        parser.error(f"--only {args.only!r}: modes are a, b, c, d")
    if args.calibrate:
        from bench.goodput import run_calibration

        run_calibration(args, sys.modules[__name__])
        return
    if args.kv_pressure:
        from bench.kv_pressure import run_kv_pressure

        run_kv_pressure(args, sys.modules[__name__])
        return
    if args.goodput:
        from bench.goodput import run_goodput

        run_goodput(args, sys.modules[__name__])
        return
    from bench.cost_split import print_cost_split

    run_started = time.perf_counter()
    split = print_cost_split(args.model, "model")
    modes = [mode for mode in MODES if mode[0] in only]
    if args.trace is not None:
        results = replay_file(args, modes)
        summaries = {key: summarise(result) for key, result in results.items()}
        print(f"model {args.model}; trace {args.trace}; {args.pods} LLM pods")
        report(args, results, summaries, split, run_started)
        return
    shape = WorkloadShape(args.users, args.turns, args.library, args.upload_share, args.later_image)
    seeds = range(args.seed, args.seed + args.seeds)
    results = {key: ModeResult(name) for key, name, _, _ in modes}
    # Seed by seed, each mode in turn: drift on a shared machine lands on every mode alike.
    for seed in seeds:
        trace = builtin_trace(args, shape, seed)
        images = image_table(trace, ROOT)
        for key, name, router, reuse in modes:
            one = run_one(args, name, router, reuse, f"seed {seed}", trace, images)
            add_seed(results[key], seed, one)
    summaries = {key: summarise(result) for key, result in results.items()}
    print(
        f"model {args.model}; per seed {args.users} users x {args.turns} turns, rate "
        f"{args.rate}/s; {args.pods} LLM pods; library {args.library} images, uploads "
        f"{args.upload_share:.0%} of images, later-turn image chance {args.later_image:.0%}, "
        f"warm-up {'on' if args.warm_up else 'off'}; seeds {list(seeds)}"
        + (f", env {args.env}" if args.env else "")
    )
    report(args, results, summaries, split, run_started)


def report(args, results: dict, summaries: dict, split, run_started: float) -> None:
    """Every mode's figures (each ending with its time per stage), the ratios, the bounds,
    the plot and the turns' JSON."""
    for key, result in results.items():
        print_mode(result, summaries[key])
    print_ratios(results, summaries, args.seeds if args.trace is None else 1)
    print_new_image_bound(summaries, split)
    print_routing_bound(results, summaries, split)
    results = list(results.values())
    plot(results, args.png, args.model)
    write_turns(results, args, args.turns_json)
    print(f"wrote {args.png} and {args.turns_json}")
    print(f"runtime of this run: {time.perf_counter() - run_started:.0f} s")


if __name__ == "__main__":
    main()
