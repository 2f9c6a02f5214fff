"""`bench/workload.py --kv-pressure`: the image chat with many more live conversations than
the LLM pods' device KV pools hold, think time between turns, under each KV tier setting
(issue 68).

The workload: `conversations` image chats of `turns` turns, all live at once. Each opens
with the shared system prompt (bench/workload.py's, about 200 tokens), then the user's own
notes (about 160 tokens in `--quick`, 260 by default; unique to the conversation) after one
of a small library of photos; every later turn adds a question with a little more of the
user's text, and resends the whole history as chat clients do. Conversations start spread
over the first seconds; between a turn's answer and the next turn the user thinks (seconds
drawn per turn), while the other conversations' turns push its pages out of the device
pool. The plan (texts, images, start and think times) is drawn from `--seed` alone: every
configuration replays the same one. A turn the gateway refuses (429 at capacity) is sent
again each second, as a client would; its TTFT counts from the first try.

Memory pressure: every pod's device pool is IRIS_LLM_KV_NUM_PAGES pages, sized to hold 1.15
times the longest conversation (so any turn fits) and nothing like all of them: the live
histories are several times the pools at every pod count (printed). The host tier
(IRIS_LLM_HOST_KV_BYTES, where on) holds every live history with room to spare; the store
is `iris up --kv-store redis`.

Configurations, each on a freshly started platform (`iris up` processes), `--pods 1` and
`--pods 3` in one run (`--pods N` runs only N):

  device          device only, prefix routing
  host            host tier, prefix routing
  store           host tier + store, prefix routing
  rr-store        host tier + store, round-robin
  wait-store      host tier + store, the `estimated-wait` policy (the default scorer
                  before `estimated-ttft`, which prices tier and store loads apart from
                  prefill: the prefix routing of the rows above)

Each is a row of CONFIGS with its router policy (the gateway's built-in name, given as
IRIS_GATEWAY_ROUTER_CONFIG): a new policy is one more row.

Reported per pod count: per configuration later-turn (turn 1 on) TTFT p50 and p90, prefill
tokens computed (prompt - cached, from usage), page lookups by tier (device, host, miss:
the pods' iris_llm_kv_tier_pages_total) and pages read from the store
(iris_llm_kv_store_hits_total), read around the measured turns; then each against device
only (device / it: above 1 is better) and the issue's target (with 3 pods, host tier + store
with prefix routing: later-turn p90 >= 3x better than device only). Drawn by turn
(bench/out/kv_pressure.png): TTFT p50 and p90 and prefill tokens computed a turn, per
configuration; every turn is written as JSON beside it.

The moved-conversation case, on `host` and `store` with two pods or more, after the
pressure turns: `moved` further conversations run two turns each, one after another; the
pod holding most of them is stopped (its process ended, as `iris up` stops one) and each of
their third turns is sent: it lands on another pod, which loads the history from the store
(`store`) or prefills it (`host`: the store off). Then the same with the pod holding most
of the rest, while two pods are left. Printed: the median TTFT of those turns in each, and
the ratio (target >= 3 on the demo model).

`--quick`: 16 conversations of 4 turns at 3 pods (both pod counts in about 12 minutes on
2 cores); the default 24 of 5 (about 30). The count is for 3 pods: N pods run the first
ceil(count x N / 3) conversations of the same plan, so each pod count has about the same
load per pod and pressure on its pools (one pod given every conversation only queues
behind the gateway's admission). Each part's wall time is printed.
"""

from __future__ import annotations

import asyncio
import json
import math
import random
import statistics
import sys
import time
from argparse import Namespace
from collections import Counter
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import httpx

from bench.goodput_search import quantile
from iris import metrics as names

PAGE_SIZE = 16  # the pods' default IRIS_LLM_PAGE_SIZE
CHARS_PER_TOKEN = 4.9  # the demo tokenizer on these texts (measured); sizes are estimates
IMAGE_TOKENS = 80  # one tile of the demo's tower (64) and the tokens around it
SYSTEM_TOKENS = 200
POOL_FACTOR = 1.15  # the device pool holds this many of the longest conversation
HOST_FACTOR = 1.5  # the host tier holds this many of every live history
STORE_MAXMEMORY_MB = 1024
# A turn the gateway refuses (429 overloaded: admission by capacity; 503) is sent again this
# often, for this long, as a client honouring Retry-After would; its TTFT counts the waits.
RETRY_AFTER_S, RETRY_FOR_S = 1.0, 90.0
WORD_LIST = (
    "garden lantern river copper meadow harbour violet engine window pebble orchard signal "
    "ladder candle marble thunder saddle velvet compass anchor cedar falcon glacier hollow "
    "island jasmine kettle lagoon mosaic nutmeg oyster parcel quarry ribbon spindle tavern "
    "umbrella walnut yarrow zephyr bramble chimney dapple ember fjord granite heron indigo "
    "juniper kiln lichen mantle nettle opal pewter quill russet slate thistle"
)
WORDS = WORD_LIST.split()
QUESTIONS = (
    "What stands out to you now?",
    "How would you describe the light?",
    "Which detail matters most here?",
    "Is anything in the picture at odds with my notes?",
    "Summarise what we have said so far.",
)


@dataclass(frozen=True)
class Shape:
    """What the conversations look like (see the module docstring)."""

    conversations: int
    turns: int
    notes_words: int  # the user's own text on the first turn
    question_words: int  # the user's added text on each later turn
    library: int  # photos, conversation c attaches photo c % library
    think_s: tuple[float, float]  # the pause before a later turn, drawn uniformly
    spread_s: float  # conversations start within this many seconds
    max_tokens: int  # each answer
    moved: int  # conversations of the moved-conversation case


QUICK = Shape(16, 4, 100, 16, 2, (4.0, 9.0), 10.0, 8, 6)
FULL = Shape(24, 5, 160, 20, 3, (6.0, 12.0), 15.0, 8, 8)


@dataclass(frozen=True)
class Setup:
    """One configuration: its router policy (the gateway's built-in name) and tiers."""

    key: str
    name: str
    policy: str
    host_tier: bool
    store: bool


CONFIGS = (
    Setup("device", "device only, prefix", "prefix-aware", False, False),
    Setup("host", "host tier, prefix", "prefix-aware", True, False),
    Setup("store", "host tier + store, prefix", "prefix-aware", True, True),
    Setup("rr-store", "host tier + store, round-robin", "round-robin", True, True),
    # The previous default scorer, by name (the rows above run the default, estimated-ttft).
    Setup("wait-store", "host tier + store, estimated wait", "estimated-wait", True, True),
)
BASELINE = "device"
TARGET = ("store", 3, 3.0)  # (config, pods, later-turn p90 ratio against device only)
MOVED = ("store", "host")  # the moved case: with the store, against prefilled
MOVED_TARGET = 3.0


# --- the plan (pure) ------------------------------------------------------------------


@dataclass(frozen=True)
class PlannedTurn:
    turn: int
    text: str
    image: str | None  # a library key
    think_s: float  # after the previous answer (0 on the first turn)


@dataclass(frozen=True)
class PlannedConversation:
    index: int
    start_s: float
    turns: tuple[PlannedTurn, ...]


def library_key(index: int) -> str:
    return f"P{index}"


def _words(rng: random.Random, count: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(count))


def build_plan(shape: Shape, seed: int) -> list[PlannedConversation]:
    """The conversations of `seed`: the same texts, photos, starts and think times each
    time, so every configuration replays one workload."""
    rng = random.Random(f"kv-pressure/{seed}")
    starts = sorted(rng.uniform(0, shape.spread_s) for _ in range(shape.conversations))
    plan = []
    for index, start in enumerate(starts):
        notes = _words(rng, shape.notes_words)
        turns = [
            PlannedTurn(
                0,
                f"My notes on this photo, conversation {index}: {notes}. What do you make of it?",
                library_key(index % shape.library),
                0.0,
            )
        ]
        for turn in range(1, shape.turns):
            words = _words(rng, shape.question_words)
            text = f"{QUESTIONS[turn % len(QUESTIONS)]} Keep in mind: {words}."
            turns.append(PlannedTurn(turn, text, None, rng.uniform(*shape.think_s)))
        plan.append(PlannedConversation(index, round(start, 3), tuple(turns)))
    return plan


def estimated_tokens(conversation: PlannedConversation, max_tokens: int) -> int:
    """Its prompt at the last turn, roughly: the system prompt, the texts, the photo and
    every answer but the last."""
    text = sum(len(turn.text) for turn in conversation.turns) / CHARS_PER_TOKEN
    images = sum(turn.image is not None for turn in conversation.turns) * IMAGE_TOKENS
    answers = (len(conversation.turns) - 1) * max_tokens
    return round(SYSTEM_TOKENS + text + images + answers)


@dataclass(frozen=True)
class Sizes:
    """The pools every configuration runs with, and the pressure they are under."""

    device_pages: int  # per pod
    host_bytes: int  # per pod, where the tier is on
    page_bytes: int
    live_pages: int  # every conversation's history at its longest (the system prompt once)
    longest_pages: int

    def pressure(self, pods: int, live_pages: int | None = None) -> float:
        """Live histories (`live_pages`, default every conversation's) over the device
        pools of `pods` pods."""
        return (live_pages or self.live_pages) / (pods * self.device_pages)

    def describe(self, live_by_pods: dict[int, int]) -> str:
        """The pools, and the pressure at each pod count given its live pages."""
        mib = self.page_bytes / 2**20
        pressure = ", ".join(
            f"{live} pages, {self.pressure(pods, live):.1f}x the pools at {pods} pods"
            for pods, live in live_by_pods.items()
        )
        return (
            f"device pool {self.device_pages} pages a pod ({self.device_pages * PAGE_SIZE} "
            f"tokens, {self.device_pages * mib:.0f} MiB at {mib:.2f} MiB a page); host tier "
            f"{self.host_bytes / 2**20:.0f} MiB a pod where on; longest conversation "
            f"{self.longest_pages} pages; live histories: {pressure}"
        )


def conversations_for(shape: Shape, pods: int) -> int:
    """The conversations run on `pods` pods: the shape's count is for 3 pods, scaled by
    the pod count, so every pod count sees about the same load per pod and the same
    pressure on its pools (one pod given all of them only queues)."""
    return max(2, math.ceil(shape.conversations * pods / 3))


def live_pages(plan: list[PlannedConversation], max_tokens: int) -> int:
    """Every conversation's history at its longest, in pages (the system prompt once)."""
    longest = [math.ceil(estimated_tokens(c, max_tokens) / PAGE_SIZE) for c in plan]
    system = SYSTEM_TOKENS // PAGE_SIZE  # the system prompt's pages are shared
    return system + sum(pages - system for pages in longest)


def size_pools(plan: list[PlannedConversation], max_tokens: int, page_bytes: int) -> Sizes:
    """A device pool of POOL_FACTOR x the longest conversation, a host tier of HOST_FACTOR
    x every live history (estimated from the plan)."""
    longest = [math.ceil(estimated_tokens(c, max_tokens) / PAGE_SIZE) for c in plan]
    live = live_pages(plan, max_tokens)
    device = math.ceil(POOL_FACTOR * max(longest))
    host = math.ceil(HOST_FACTOR * live) * page_bytes
    return Sizes(device, host, page_bytes, live, max(longest))


def page_bytes_of(model_dir: Path, dtype_bytes: int = 4) -> int:
    """One page's K and V over every layer, from the checkpoint's config (float32 on the
    CPU; bfloat16 on a GPU is half)."""
    config = json.loads((Path(model_dir) / "config.json").read_text())
    text = config.get("text_config", config)
    heads = text["num_attention_heads"]
    head_dim = text.get("head_dim") or text["hidden_size"] // heads
    kv_heads = text.get("num_key_value_heads", heads)
    return text["num_hidden_layers"] * 2 * kv_heads * head_dim * dtype_bytes * PAGE_SIZE


# --- results (pure) -------------------------------------------------------------------


@dataclass
class TurnRecord:
    conversation: int
    turn: int
    ttft_s: float
    prompt_tokens: int
    cached_tokens: int
    pod: str
    ok: bool
    sent_s: float = 0.0
    refused: int = 0  # times the gateway answered 429 or 503 before it took the turn

    @property
    def prefilled(self) -> int:
        """Prompt tokens the pod computed (the rest came from a tier or the store)."""
        return self.prompt_tokens - self.cached_tokens


@dataclass
class ConfigResult:
    setup: Setup
    pods: int
    turns: list[TurnRecord] = field(default_factory=list)
    tiers: dict[str, float] = field(default_factory=dict)  # counters over the measured turns
    moved: list[TurnRecord] = field(default_factory=list)
    wall_s: dict[str, float] = field(default_factory=dict)  # by part


def by_turn(turns: list[TurnRecord]) -> dict[int, dict[str, float]]:
    """Per turn number: how many answered, TTFT p50 and p90 (ms), prefill tokens computed
    (mean a turn)."""
    table = {}
    for number in sorted({t.turn for t in turns if t.ok}):
        ok = [t for t in turns if t.ok and t.turn == number]
        ttfts = [t.ttft_s for t in ok]
        table[number] = {
            "turns": len(ok),
            "ttft_p50_ms": quantile(ttfts, 50) * 1e3,
            "ttft_p90_ms": quantile(ttfts, 90) * 1e3,
            "prefill_tokens": statistics.fmean(t.prefilled for t in ok),
        }
    return table


def summarise(turns: list[TurnRecord]) -> dict[str, float]:
    """Later-turn TTFT p50 / p90 (ms), prefill tokens computed (all and later turns), the
    gateway's refusals sent again, and how many turns failed."""
    ok = [t for t in turns if t.ok]
    later = [t for t in ok if t.turn > 0]
    return {
        "later_p50_ms": quantile([t.ttft_s for t in later], 50) * 1e3,
        "later_p90_ms": quantile([t.ttft_s for t in later], 90) * 1e3,
        "prefill_tokens": sum(t.prefilled for t in ok),
        "later_prefill_tokens": sum(t.prefilled for t in later),
        "prompt_tokens": sum(t.prompt_tokens for t in ok),
        "failed": len(turns) - len(ok),
        "refused": sum(t.refused for t in turns),
    }


def ratios(summaries: dict[str, dict], base: str = BASELINE) -> dict[str, dict[str, float]]:
    """Each configuration against `base`: base's figure over its own (above 1: better)."""

    def over(a: float, b: float) -> float:
        return a / b if b else math.nan

    reference = summaries[base]
    return {
        key: {
            "later_p50": over(reference["later_p50_ms"], one["later_p50_ms"]),
            "later_p90": over(reference["later_p90_ms"], one["later_p90_ms"]),
            "prefill": over(reference["prefill_tokens"], one["prefill_tokens"]),
        }
        for key, one in summaries.items()
        if key != base
    }


def moved_medians(store: list[TurnRecord], prefilled: list[TurnRecord]) -> tuple[float, float]:
    """The median TTFT (ms) of the moved turns with the store and without it."""

    def median(turns: list[TurnRecord]) -> float:
        ok = [t.ttft_s for t in turns if t.ok]
        return statistics.median(ok) * 1e3 if ok else math.nan

    return median(store), median(prefilled)


def verdict(ratio: float, target: float) -> str:
    return "met" if ratio >= target else "NOT met"


def format_table(pods: int, results: dict[str, ConfigResult]) -> list[str]:
    """One pod count's rows, its ratios against device only and the target line."""
    summaries = {key: summarise(result.turns) for key, result in results.items()}
    lines = [
        f"--pods {pods}: config | later-turn TTFT p50 / p90 ms | prefill tokens computed "
        f"(later turns) of prompt | pages device / host / miss | store pages read | refused, failed"
    ]
    for key, result in results.items():
        s, tiers = summaries[key], result.tiers
        lines.append(
            f"  {result.setup.name:<34} | {s['later_p50_ms']:7.0f} / {s['later_p90_ms']:7.0f} | "
            f"{s['prefill_tokens']:,} ({s['later_prefill_tokens']:,}) of {s['prompt_tokens']:,} | "
            f"{tiers.get('device', 0):,.0f} / {tiers.get('host', 0):,.0f} / "
            f"{tiers.get('miss', 0):,.0f} | {tiers.get('store', 0):,.0f} | "
            f"{s['refused']}, {s['failed']}"
        )
    if any(not result.setup.host_tier for result in results.values()):
        lines.append(
            "  (the pods count page lookups by tier only with the host tier on: without it, "
            "the cached tokens are its device hits)"
        )
    if BASELINE in summaries:
        for key, ratio in ratios(summaries).items():
            lines.append(
                f"  ratio device only / {results[key].setup.name}: later-turn p50 "
                f"{ratio['later_p50']:.2f}, p90 {ratio['later_p90']:.2f}, prefill tokens "
                f"{ratio['prefill']:.2f}"
            )
        key, target_pods, target = TARGET
        if pods == target_pods and key in summaries:
            got = ratios(summaries)[key]["later_p90"]
            lines.append(
                f"  target: {results[key].setup.name}, later-turn p90 >= {target:g}x better "
                f"than device only: {got:.2f} ({verdict(got, target)})"
            )
    with_store, without = (results.get(key) for key in MOVED)
    if with_store and without and with_store.moved and without.moved:
        store_ms, prefill_ms = moved_medians(with_store.moved, without.moved)
        ratio = prefill_ms / store_ms
        lines.append(
            f"  moved conversation (its pod stopped between turns), next-turn TTFT median: "
            f"store {store_ms:.0f} ms over {len(with_store.moved)} turns, prefilled "
            f"{prefill_ms:.0f} ms over {len(without.moved)}; ratio {ratio:.2f} (target >= "
            f"{MOVED_TARGET:g}: {verdict(ratio, MOVED_TARGET)})"
        )
    return lines


# --- driving a platform ---------------------------------------------------------------


@dataclass
class Chat:
    """A conversation's history as sent, and where its last turn ran."""

    planned: PlannedConversation
    messages: list[dict] = field(default_factory=list)
    sent: int = 0  # turns sent so far
    pod: str = ""


@dataclass
class Link:
    client: httpx.AsyncClient
    url: str
    model: str
    images: dict[str, bytes]
    max_tokens: int
    started: float
    workload: object  # bench.workload (run_turn, image_part, SYSTEM_PROMPT)


async def send(link: Link, chat: Chat) -> TurnRecord:
    """The chat's next planned turn with its whole history; the answer joins the history."""
    planned = chat.planned.turns[chat.sent]
    if not chat.messages:
        chat.messages.append({"role": "system", "content": link.workload.SYSTEM_PROMPT})
    # The photo before the text, as in bench/trace.py: the system prompt and the photo are a
    # prefix shared by the conversations on that photo (hot: never a reason to fetch the
    # embedding again), the user's own words are not.
    content = [link.workload.image_part(link.images[planned.image])] if planned.image else []
    content.append({"type": "text", "text": planned.text})
    chat.messages.append({"role": "user", "content": content})
    chat.sent += 1
    sent = time.perf_counter()
    index, refused = chat.planned.index, 0
    while True:
        try:
            ttft, total, usage, answer, pod = await link.workload.run_turn(
                link.client, link.url, link.model, chat.messages, link.max_tokens
            )
            # As the user saw it: from the first try (a refusal's wait included).
            ttft += time.perf_counter() - total - sent
            break
        except Exception as err:  # a refusal is tried again, as a client would
            late = time.perf_counter() - sent > RETRY_FOR_S
            if str(err).startswith(("HTTP 429", "HTTP 503")) and not late:
                refused += 1
                await asyncio.sleep(RETRY_AFTER_S)
                continue
            print(f"  conversation {index} turn {planned.turn} failed: {err}", file=sys.stderr)
            return TurnRecord(index, planned.turn, 0.0, 0, 0, "", False, sent - link.started)
    chat.messages.append({"role": "assistant", "content": answer})
    chat.pod = pod
    cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0) or 0
    prompt = usage.get("prompt_tokens", 0)
    return TurnRecord(
        index, planned.turn, ttft, prompt, cached, pod, True, sent - link.started, refused
    )


async def run_pressure(link: Link, plan: list[PlannedConversation]) -> list[TurnRecord]:
    """Every conversation at its start, each turn after the last answer and its think time."""
    records: list[TurnRecord] = []

    async def converse(conversation: PlannedConversation) -> None:
        await asyncio.sleep(max(0.0, link.started + conversation.start_s - time.perf_counter()))
        chat = Chat(conversation)
        for planned in conversation.turns:
            await asyncio.sleep(planned.think_s)
            record = await send(link, chat)
            records.append(record)
            if not record.ok:
                return

    link.started = time.perf_counter()
    await asyncio.gather(*(converse(conversation) for conversation in plan))
    return records


async def warm_up(link: Link, library: int) -> None:
    """Each photo once (the encoder's tower runs now, not in the measured turns), and the
    system prompt with it."""
    for index in range(library):
        turn = PlannedTurn(0, "What is in this picture?", library_key(index), 0.0)
        record = await send(link, Chat(PlannedConversation(-1 - index, 0.0, (turn,))))
        if not record.ok:
            raise RuntimeError(f"warm-up photo {index} failed")


def llm_pods(platform) -> list:
    return [s for s in platform.services if s.kind == "llm" and not s.exited()]


def tier_counts(platform) -> dict[str, float]:
    """The pods' KV counters, summed over the running pods: page lookups by tier, pages read
    from the store, bytes written to it."""
    from iris.up.metrics_page import metrics_url, scrape

    counts = dict.fromkeys(("device", "host", "miss", "store", "store_written_bytes"), 0.0)
    for pod in llm_pods(platform):
        url = metrics_url(pod)
        for tier in ("device", "host", "miss"):
            page = scrape(url, {names.LABEL_TIER: tier})
            counts[tier] += page.get(names.LLM_KV_TIER_PAGES, 0.0)
        counts["store"] += scrape(url).get(names.LLM_KV_STORE_HITS, 0.0)
        written = scrape(url, {names.LABEL_DIRECTION: "written"})
        counts["store_written_bytes"] += written.get(names.LLM_KV_STORE_BYTES, 0.0)
    return counts


def wait_store_settled(platform, cap_s: float = 30.0) -> None:
    """Until the pods' writers have put their pages in the store: the written bytes held
    still over two polls (the writers drain their queues in batches)."""
    deadline, seen = time.monotonic() + cap_s, []
    while time.monotonic() < deadline:
        seen.append(tier_counts(platform)["store_written_bytes"])
        if len(seen) >= 3 and seen[-1] == seen[-2] == seen[-3]:
            return
        time.sleep(0.5)


def pod_service(platform, pod: str):
    """The LLM service an X-Iris-Pod value names (its address or its name)."""
    for service in platform.services:
        if service.kind == "llm" and pod in (service.address, service.name):
            return service
    return None


async def run_moved(link: Link, platform, plan: list[PlannedConversation], store: bool):
    """The moved-conversation case (see the module docstring): the moved turns."""
    chats = [Chat(conversation) for conversation in plan]
    for chat in chats:
        for _ in range(len(chat.planned.turns) - 1):
            if not (await send(link, chat)).ok:
                break
    if store:
        await asyncio.to_thread(wait_store_settled, platform)
    pending = [chat for chat in chats if chat.sent == len(chat.planned.turns) - 1 and chat.pod]
    moved: list[TurnRecord] = []
    while len(llm_pods(platform)) >= 2 and pending:
        victim, _ = Counter(chat.pod for chat in pending).most_common(1)[0]
        service = pod_service(platform, victim)
        if service is None or service.exited():
            break
        await asyncio.to_thread(service.child.stop)
        await asyncio.sleep(2.0)  # the gateway's health watch takes it out of routing
        held = [chat for chat in pending if chat.pod == victim]
        pending = [chat for chat in pending if chat.pod != victim]
        for chat in held:
            moved.append(await send(link, chat))
    return moved


# --- one configuration, one run -------------------------------------------------------


def config_for(args, setup: Setup, pods: int, sizes: Sizes, workload):
    """The platform of one configuration: the workload benchmark's (slow-tower leases, the
    pod header, --env) with the pools, tiers and router policy."""
    base = workload.up_config(
        Namespace(**{**vars(args), "pods": pods, "gateways": 1}), "prefix", True
    )
    env = {kind: dict(values) for kind, values in base.extra_env.items()}
    env.setdefault("llm", {}).setdefault("IRIS_LLM_KV_NUM_PAGES", str(sizes.device_pages))
    gateway = env.setdefault("gateway", {})
    gateway.setdefault("IRIS_GATEWAY_ROUTER_CONFIG", setup.policy)
    # Device only on one pod queues a turn at the pod past the default 60 s of silence; the
    # client waits for it here (its TTFT says how long), as for the tower's leases.
    gateway.setdefault("IRIS_GATEWAY_STREAM_IDLE_S", "600")
    return replace(
        base,
        extra_env=env,
        kv_store="redis" if setup.store else "off",
        host_kv_bytes=sizes.host_bytes if setup.host_tier else 0,
        kv_store_maxmemory_mb=STORE_MAXMEMORY_MB,
    )


def run_config(args, setup: Setup, pods: int, sizes: Sizes, shape: Shape, workload, plan):
    """One configuration on a freshly started platform: warm-up, the pressure turns, then
    (where it applies) the moved-conversation case."""
    result = ConfigResult(setup, pods)
    started = time.perf_counter()
    moved_plan = build_plan(replace(shape, conversations=shape.moved, turns=3), args.seed + 1000)
    images = {
        library_key(i): workload.make_image(library_key(i), args.seed) for i in range(shape.library)
    }
    with workload.Platform(config_for(args, setup, pods, sizes, workload)) as platform:
        result.wall_s["start"] = time.perf_counter() - started
        asyncio.run(drive(result, platform, plan, moved_plan, images, shape, workload))
    result.wall_s["all"] = time.perf_counter() - started
    walls = ", ".join(f"{part} {seconds:.0f} s" for part, seconds in result.wall_s.items())
    print(f"[{setup.name}, {pods} pods] {walls}", flush=True)
    print(format_table(pods, {setup.key: result})[1], flush=True)  # its row, as it ends
    return result


async def drive(result, platform, plan, moved_plan, images, shape, workload) -> None:
    async with httpx.AsyncClient(timeout=600) as client:
        url = platform.gateway_url
        model = (await client.get(f"{url}/v1/models")).json()["data"][0]["id"]
        link = Link(client, url, model, images, shape.max_tokens, time.perf_counter(), workload)
        mark = time.perf_counter()
        await warm_up(link, shape.library)
        result.wall_s["warm-up"] = time.perf_counter() - mark
        before = await asyncio.to_thread(tier_counts, platform)
        mark = time.perf_counter()
        result.turns = await run_pressure(link, plan)
        result.wall_s["pressure"] = time.perf_counter() - mark
        after = await asyncio.to_thread(tier_counts, platform)
        result.tiers = {key: after[key] - before[key] for key in before}
        if result.setup.key in MOVED and result.pods >= 2:
            mark = time.perf_counter()
            link.started = mark
            result.moved = await run_moved(link, platform, moved_plan, result.setup.store)
            result.wall_s["moved"] = time.perf_counter() - mark


def plot(results: dict[int, dict[str, ConfigResult]], path: Path, model) -> None:
    """Per pod count: later-turn TTFT p50 (dashed) and p90 (solid) by turn, and prefill
    tokens computed a turn, one line per configuration."""
    from bench.plots import figure, save, stamp

    fig, axes = figure(2, len(results), size=(6 * len(results), 8))
    for column, (pods, configs) in enumerate(results.items()):
        ttft, prefill = axes[0][column], axes[1][column]
        last = max((t.turn for result in configs.values() for t in result.turns), default=0)
        for index, result in enumerate(configs.values()):
            table = by_turn(result.turns)
            turns = list(table)
            color = f"C{index}"
            name = result.setup.name
            ttft.plot(turns, [table[t]["ttft_p90_ms"] for t in turns], color=color, marker="o",
                      label=f"{name} p90")  # fmt: skip
            ttft.plot(turns, [table[t]["ttft_p50_ms"] for t in turns], color=color,
                      linestyle="--", label=f"{name} p50")  # fmt: skip
            prefill.plot(turns, [table[t]["prefill_tokens"] for t in turns], color=color,
                         marker="o", label=name)  # fmt: skip
        ttft.set_yscale("log")
        ttft.set_title(f"{pods} pod{'s' if pods > 1 else ''}: TTFT by turn", fontsize=9)
        ttft.set_ylabel("TTFT (ms, log)")
        prefill.set_title("prefill tokens computed a turn (mean)", fontsize=9)
        prefill.set_ylabel("tokens")
        for axis in (ttft, prefill):
            axis.set_xticks(range(last + 1))
            axis.set_xlabel("turn")
            axis.grid(True, alpha=0.3)
            axis.legend(fontsize=6)
    fig.subplots_adjust(hspace=0.35)
    stamp(fig, model)
    save(fig, path)


def write_json(results: dict[int, dict[str, ConfigResult]], sizes: Sizes, args, path: Path):
    document = {
        "args": {key: str(value) for key, value in vars(args).items()},
        "sizes": asdict(sizes),
        "runs": {
            str(pods): {key: asdict(result) for key, result in configs.items()}
            for pods, configs in results.items()
        },
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(document, indent=1))


def run_kv_pressure(args, workload) -> None:
    """The whole run (see the module docstring); `workload` is bench.workload."""
    started = time.perf_counter()
    shape = QUICK if args.quick else FULL
    pods_list = [args.pods] if args.pods else [3, 1]  # the target's pod count first
    plan = build_plan(shape, args.seed)
    sizes = size_pools(plan, shape.max_tokens, page_bytes_of(args.model))
    # Each pod count runs the first conversations_for(...) of the one plan.
    plans = {pods: plan[: conversations_for(shape, pods)] for pods in pods_list}
    print(
        f"kv-pressure: {shape.conversations} conversations at 3 pods x {shape.turns} turns, "
        f"notes of {shape.notes_words} words, {shape.library} photos, think {shape.think_s[0]:g}-"
        f"{shape.think_s[1]:g} s, starts within {shape.spread_s:g} s, answers of "
        f"{shape.max_tokens} tokens; pods {pods_list}; seed {args.seed}",
        flush=True,
    )
    live = {pods: live_pages(plans[pods], shape.max_tokens) for pods in pods_list}
    print(sizes.describe(live), flush=True)
    results: dict[int, dict[str, ConfigResult]] = {}
    for pods in pods_list:
        mark = time.perf_counter()
        results[pods] = {
            setup.key: run_config(args, setup, pods, sizes, shape, workload, plans[pods])
            for setup in CONFIGS
        }
        print(f"--pods {pods}: {time.perf_counter() - mark:.0f} s", flush=True)
    for pods, configs in results.items():
        longest = max((t.prompt_tokens for c in configs.values() for t in c.turns), default=0)
        print(f"--pods {pods}: longest prompt measured {longest} tokens")
        print("\n".join(format_table(pods, configs)))
    png = args.kv_pressure_png
    plot(results, png, args.model)
    write_json(results, sizes, args, png.with_suffix(".json"))
    print(f"wrote {png} and {png.with_suffix('.json')}")
    print(f"runtime of this run: {time.perf_counter() - started:.0f} s")
