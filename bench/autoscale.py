"""Autoscaling simulator: the Iris policy against static peak provisioning and a KV-only,
HPA-style policy, on one fixed trace, side by side in one run.

Trace (issue 12): 60 simulated minutes; base load 2 requests/s, each 1 image + 500 text
tokens; a 10x burst (20 requests/s) for 3 minutes at minutes 10, 30 and 50; a slow ramp
from 1x to 4x over minutes 35-45 (it stays at 4x afterwards; a burst is 10x the base, not
10x the ramp). Pods take 60 s from being asked for to being ready; removal is immediate.
An LLM pod serves 4 requests/s at the SLO, an encoder pod 20 images/s.

Pod model (fluid, 1 s steps): requests queue at the encoders (images) and then at the LLM
pods. An LLM pod's KV utilisation is 0.8 x served/4 and 1.0 while requests wait; its
waiting requests and pending prefill tokens are the queue shared out over the ready pods.
An encoder pod's busy ratio is served/20; its queued vision tokens are its share of the
queue x 256. The SLO: queueing delay (encoder queue / encoder rate + LLM queue / LLM rate)
at most 2 s. Each policy decides every 15 s from the pods' metrics as the operator would.

Run: .venv/bin/python bench/autoscale.py  (writes bench/out/autoscale.png)
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

from operators.policy import EncoderLoad, History, LLMLoad, Loads, PoolLoads, desired_replicas
from operators.spec import parse_spec

DURATION_S = 3600
STEP_S = 1
DECIDE_EVERY_S = 15
START_DELAY_S = 60
TEXT_TOKENS = 500
VISION_TOKENS = 256  # tokens of one image after the projector (a typical small VLM)
LLM_RATE = 4.0  # requests/s per LLM pod at the SLO
ENCODER_RATE = 20.0  # images/s per encoder pod
SLO_DELAY_S = 2.0
KV_AT_SLO = 0.8

IRIS_SPEC = parse_spec(
    {
        "llm": {
            "deployment": "llm",
            "selector": {"matchLabels": {"c": "llm"}},
            "minReplicas": 1,
            "maxReplicas": 8,
            # Queue targets of ~5 s of one pod's work: a backlog worth draining, not noise.
            "targets": {
                "kvUtilisation": 0.7,
                "requestsWaiting": 20,
                "pendingPrefillTokens": 20 * (TEXT_TOKENS + VISION_TOKENS),
            },
        },
        "encoder": {
            "deployment": "enc",
            "selector": {"matchLabels": {"c": "enc"}},
            "minReplicas": 1,
            "maxReplicas": 8,
            "targets": {"queuedVisionTokens": 40 * VISION_TOKENS, "busyRatio": 0.7},
        },
        "tolerance": 0.1,
        "scaleUp": {"stabilisationSeconds": 0, "maxStep": 8},
        "scaleDown": {"stabilisationSeconds": 60, "maxStep": 4},
        # Each queued vision token comes with its request's share of text tokens.
        "coupling": {"prefillTokensPerVisionToken": (TEXT_TOKENS + VISION_TOKENS) / VISION_TOKENS},
    }
)
WINDOW_S = IRIS_SPEC.scale_down.stabilisation_s


def arrival_rate(t: float) -> float:
    """Requests/s at simulated second t."""
    minute = t / 60
    ramp = 1.0 + 3.0 * min(max((minute - 35) / 10, 0.0), 1.0)
    burst = any(start <= minute < start + 3 for start in (10, 30, 50))
    return 2.0 * (max(ramp, 10.0) if burst else ramp)


@dataclass
class Pool:
    """Pods of one Deployment: asked-for replicas and when each started pod becomes ready."""

    desired: int
    ready: int
    starting: list[float] = field(default_factory=list)

    def resize(self, replicas: int, now: float) -> None:
        pending = self.ready + len(self.starting)
        if replicas > pending:
            self.starting += [now + START_DELAY_S] * (replicas - pending)
        elif replicas < pending:
            drop = pending - replicas
            cut = min(drop, len(self.starting))  # cancel pods still starting first
            self.starting = self.starting[: len(self.starting) - cut]
            self.ready -= drop - cut
        self.desired = replicas

    def tick(self, now: float) -> None:
        done = [t for t in self.starting if t <= now]
        self.ready += len(done)
        self.starting = [t for t in self.starting if t > now]


@dataclass
class World:
    """The queues and what the pods report."""

    llm: Pool
    enc: Pool
    enc_queue: float = 0.0  # images
    llm_queue: float = 0.0  # requests
    llm_served: float = 0.0  # requests/s in the last step
    enc_served: float = 0.0  # images/s in the last step

    def step(self, t: float) -> float:
        """Advance one second; return the queueing delay in seconds."""
        self.llm.tick(t)
        self.enc.tick(t)
        arrivals = arrival_rate(t) * STEP_S
        enc_cap = ENCODER_RATE * self.enc.ready * STEP_S
        self.enc_queue += arrivals
        self.enc_served = min(self.enc_queue, enc_cap)
        self.enc_queue -= self.enc_served
        llm_cap = LLM_RATE * self.llm.ready * STEP_S
        self.llm_queue += self.enc_served
        self.llm_served = min(self.llm_queue, llm_cap)
        self.llm_queue -= self.llm_served
        enc_delay = self.enc_queue / enc_cap if enc_cap else math.inf
        llm_delay = self.llm_queue / llm_cap if llm_cap else math.inf
        return enc_delay + llm_delay

    def llm_loads(self) -> list[LLMLoad]:
        n = self.llm.ready
        if not n:
            return []
        kv = 1.0 if self.llm_queue > 0.5 else KV_AT_SLO * self.llm_served / (LLM_RATE * n)
        waiting = self.llm_queue / n
        pending = waiting * (TEXT_TOKENS + VISION_TOKENS)
        return [LLMLoad(kv, waiting, pending)] * n

    def enc_loads(self) -> list[EncoderLoad]:
        n = self.enc.ready
        if not n:
            return []
        queued = self.enc_queue / n
        busy = min(1.0, self.enc_served / (ENCODER_RATE * n))
        return [EncoderLoad(queued, queued * VISION_TOKENS, busy)] * n


class IrisPolicy:
    """The operator's pure policy, fed the simulated pods' metrics."""

    name = "iris"

    def __init__(self) -> None:
        self.history = History()

    def decide(self, world: World, now: float) -> tuple[int, int]:
        loads = Loads(
            llm=PoolLoads(world.llm.desired, tuple(world.llm_loads())),
            encoder=PoolLoads(world.enc.desired, tuple(world.enc_loads())),
            now=now,
        )
        decision = desired_replicas(loads, IRIS_SPEC, self.history)
        self.history = decision.history
        return decision.llm.desired, decision.encoder.desired


class KVOnlyHPA:
    """HPA-style: replicas x average utilisation / target (KV for the LLM, busy ratio for the
    encoder), 10 % tolerance, the same scale-down window as Iris, up to double per decision."""

    name = "kv-only hpa"

    def __init__(self) -> None:
        self.recs: dict[str, list[tuple[float, int]]] = {"llm": [], "enc": []}

    def _one(self, kind: str, current: int, utils: list[float], target: float, now, hi) -> int:
        if not utils:
            return current
        ratio = sum(utils) / len(utils) / target
        rec = current if abs(ratio - 1) <= 0.1 else math.ceil(len(utils) * ratio)
        rec = max(1, min(hi, rec, max(2 * current, 4)))
        recs = [(t, r) for t, r in self.recs[kind] if now - t < WINDOW_S] + [(now, rec)]
        self.recs[kind] = recs
        return rec if rec >= current else max(r for _, r in recs)

    def decide(self, world: World, now: float) -> tuple[int, int]:
        llm = self._one(
            "llm", world.llm.desired, [p.kv_utilisation for p in world.llm_loads()], 0.7, now, 8
        )
        enc = self._one(
            "enc", world.enc.desired, [p.busy_ratio for p in world.enc_loads()], 0.7, now, 8
        )
        return llm, enc


class StaticPeak:
    """Enough pods for the peak rate, all the time."""

    name = "static peak"
    llm = math.ceil(max(arrival_rate(t) for t in range(DURATION_S)) / LLM_RATE)
    enc = math.ceil(max(arrival_rate(t) for t in range(DURATION_S)) / ENCODER_RATE)

    def decide(self, world: World, now: float) -> tuple[int, int]:
        return self.llm, self.enc


@dataclass
class Result:
    name: str
    replica_seconds: float
    over_slo_s: int
    llm_series: list[int]
    enc_series: list[int]
    turns_in_window: int  # direction changes closer than one stabilisation window


def simulate(policy) -> Result:
    first_llm, first_enc = (
        (StaticPeak.llm, StaticPeak.enc) if policy.name == "static peak" else (1, 1)
    )
    world = World(Pool(first_llm, first_llm), Pool(first_enc, first_enc))
    replica_s, over, llm_series, enc_series = 0.0, 0, [], []
    for t in range(0, DURATION_S, STEP_S):
        if t % DECIDE_EVERY_S == 0:
            llm, enc = policy.decide(world, float(t))
            world.llm.resize(llm, t)
            world.enc.resize(enc, t)
        over += world.step(float(t)) > SLO_DELAY_S
        # Pods cost from the moment they are asked for (a starting pod holds its node).
        replica_s += (world.llm.desired + world.enc.desired) * STEP_S
        llm_series.append(world.llm.desired)
        enc_series.append(world.enc.desired)
    turns = _close_turns(llm_series) + _close_turns(enc_series)
    return Result(policy.name, replica_s, over, llm_series, enc_series, turns)


def _close_turns(series: list[int]) -> int:
    """Direction changes that follow the previous one within less than a window."""
    turns, last_dir = [], 0
    for t in range(1, len(series)):
        step = (series[t] > series[t - 1]) - (series[t] < series[t - 1])
        if step and last_dir and step != last_dir:
            turns.append(t)
        last_dir = step or last_dir
    return sum(1 for a, b in zip(turns, turns[1:], strict=False) if b - a < WINDOW_S)


def oracle_over_slo_s() -> int:
    """Seconds over the SLO of an oracle that asks for exactly the pods the load needs the
    instant it changes: what any policy without foresight pays for the 60 s start."""

    class Oracle:
        name = "oracle"

        def decide(self, world: World, now: float) -> tuple[int, int]:
            rate = max(arrival_rate(t) for t in range(int(now), int(now) + DECIDE_EVERY_S))
            backlog = world.llm_queue + world.enc_queue
            # Enough for the rate, plus enough to drain any backlog within 15 s.
            return (
                math.ceil((rate + backlog / 15) / LLM_RATE),
                math.ceil((rate + world.enc_queue / 15) / ENCODER_RATE),
            )

    return simulate(Oracle()).over_slo_s


def plot(results: list[Result], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    minutes = [t / 60 for t in range(0, DURATION_S, STEP_S)]
    fig, (top, mid, bottom) = plt.subplots(3, 1, sharex=True, figsize=(10, 8))
    top.plot(minutes, [arrival_rate(t) for t in range(0, DURATION_S, STEP_S)], color="black")
    top.set_ylabel("requests/s")
    top.set_title("load and replicas over time")
    for result in results:
        mid.plot(minutes, result.llm_series, label=result.name)
        bottom.plot(minutes, result.enc_series, label=result.name)
    mid.set_ylabel("LLM replicas")
    bottom.set_ylabel("encoder replicas")
    bottom.set_xlabel("minute")
    mid.legend()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)


def main() -> None:
    results = [simulate(StaticPeak()), simulate(KVOnlyHPA()), simulate(IrisPolicy())]
    static, hpa, iris = results
    print(f"{'policy':<12} {'replica-s':>10} {'vs static':>10} {'over SLO':>9} {'turns<win':>9}")
    for r in results:
        saving = 1 - r.replica_seconds / static.replica_seconds
        share = r.over_slo_s / DURATION_S
        print(
            f"{r.name:<12} {r.replica_seconds:>10.0f} {saving:>+10.1%} {share:>9.2%} "
            f"{r.turns_in_window:>9d}"
        )
    floor = oracle_over_slo_s()
    share = floor / DURATION_S
    print(f"oracle reference (knows the rate ahead, 60 s start): {share:.2%} over SLO")
    print(f"replica-seconds iris / kv-only hpa: {iris.replica_seconds / hpa.replica_seconds:.3f}")
    print(
        f"fewer replica-seconds: {100 * (1 - iris.replica_seconds / static.replica_seconds):.1f} %"
    )
    out = Path(__file__).resolve().parent / "out" / "autoscale.png"
    plot(results, out)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
