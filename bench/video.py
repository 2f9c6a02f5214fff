"""Video frame groups shared across requests and clips, against whole-video caching.

One platform (`iris up` processes on the tiny random Qwen3-VL checkpoint). Three workloads,
each clip built from one set of source frames with an intra-only codec (MJPEG in AVI, or
FFV1), so that clips cut from the same source decode to bit-identical frames:

- `same clip`: one clip asked three questions;
- `stream`: a stream read as windows that overlap by 75 % (each window 4x the stride);
- `distinct`: clips from different sources, each asked once.

Each runs twice on the same platform: as Iris serves it (one `cache_salt` per workload and
mode, so nothing carries over between them), and as a baseline that caches whole video
items, as vLLM does: a hit only for an identical clip (its requests carry a salt derived
from the workload and the clip's bytes, so two clips never share a group, while the same
clip shares all).

    python bench/video.py [--source-seconds 40] [--window 8] [--codec mjpeg|ffv1]

Prints per workload and mode the frame groups encoded (the encoder's
iris_encoder_images_total) and the encoder's seconds (its process's CPU time over the
workload, /proc: wall time on this shared machine says more about the neighbours); the
target on the stream: Iris encodes <= 30 % of the baseline's groups. Then the gateway's decode time
per second of video (iris_gateway_video_decode_seconds over iris_gateway_video_seconds_total)
and its event loop's lag while videos arrive (GET /healthz probed back to back, as
bench/hostile.py measures it: p99 and worst against the quiet median).

TTFT is not printed: a tiny tower costs too little to show it, and no demo-sized Qwen3-VL
checkpoint exists here. A benchmark, not a test: the seconds depend on the machine.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import os
import statistics
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT)]

from iris.up.metrics_page import metrics_url, scrape  # noqa: E402
from iris.up.platform import Platform, UpConfig  # noqa: E402
from tests.fixtures.videos import encode_video, source_frames  # noqa: E402

SOURCE_FPS = 4  # source frames per second; Iris samples 2: one group per second
QUESTIONS = ("What happens?", "What colour dominates?", "Is anything moving?")


@dataclass
class Request:
    clip: bytes
    question: str


def workloads(seconds: int, window: int, codec: str) -> dict[str, list[Request]]:
    """name -> requests, in the order they are sent."""
    container = "avi" if codec == "mjpeg" else "matroska"

    def clip(frames) -> bytes:
        return encode_video(frames, fps=SOURCE_FPS, codec=codec, container=container)

    width, height = 96, 64
    source = source_frames(seconds * SOURCE_FPS, width, height, seed=1)
    stride = window // 4  # consecutive windows overlap by 75 %
    windows = [
        clip(source[start * SOURCE_FPS : (start + window) * SOURCE_FPS])
        for start in range(0, seconds - window + 1, stride)
    ]
    one = clip(source[: window * SOURCE_FPS])
    distinct = [
        clip(source_frames(window * SOURCE_FPS, width, height, seed=100 + i)) for i in range(4)
    ]
    return {
        "same clip": [Request(one, question) for question in QUESTIONS],
        "stream": [Request(data, QUESTIONS[0]) for data in windows],
        "distinct": [Request(data, QUESTIONS[0]) for data in distinct],
    }


def _body(model: str, request: Request, salt: str) -> dict:
    url = "data:video/x-msvideo;base64," + base64.b64encode(request.clip).decode()
    content = [
        {"type": "video_url", "video_url": {"url": url}},
        {"type": "text", "text": request.question},
    ]
    return {
        "model": model,
        "messages": [{"role": "user", "content": content}],
        "max_tokens": 4,
        "temperature": 0,
        "cache_salt": salt,
    }


def _encoder_totals(platform: Platform) -> tuple[float, float]:
    """(items encoded, the encoder process's CPU seconds so far)."""
    encoder = next(service for service in platform.services if service.kind == "encoder")
    items = scrape(metrics_url(encoder)).get("iris_encoder_images_total", 0.0)
    fields = Path(f"/proc/{encoder.child.process.pid}/stat").read_text().rpartition(")")[2]
    utime, stime = (int(value) for value in fields.split()[11:13])
    return items, (utime + stime) / os.sysconf("SC_CLK_TCK")


def _settled(platform: Platform) -> tuple[float, float]:
    """The encoder's totals once they hold still for 0.3 s (an Encode may outlive the
    response that needed it, though the pod waits for its groups before answering)."""
    totals, still = _encoder_totals(platform), 0
    while still < 3:
        time.sleep(0.1)
        again = _encoder_totals(platform)
        still = still + 1 if again == totals else 0
        totals = again
    return totals


def run_workload(platform: Platform, model: str, name: str, requests, baseline: bool):
    """(groups encoded, encoder CPU seconds, groups encoded after each request) for one
    workload in one mode."""
    before = _settled(platform)
    after = before
    cumulative = []
    with httpx.Client(base_url=platform.gateway_url, timeout=300) as client:
        for request in requests:
            if baseline:  # whole-video caching: the clip's bytes are its only key
                digest = hashlib.sha256(request.clip).hexdigest()[:32]
                salt = f"baseline-{name}-{digest}"
            else:
                salt = "iris-" + name
            response = client.post("/v1/chat/completions", json=_body(model, request, salt))
            response.raise_for_status()
            after = _settled(platform)
            cumulative.append(after[0] - before[0])
    return after[0] - before[0], after[1] - before[1], cumulative


def plot(rows, path: str = "video_groups.png") -> Path:
    """Groups encoded per workload, Iris against the baseline; and the stream's groups
    encoded after each window."""
    from bench.plots import figure, save, stamp

    fig, axes = figure(1, 2, size=(10.0, 4.5))
    bars, lines = axes[0]
    names = [row[0] for row in rows]
    xs = range(len(rows))
    bars.bar([x - 0.2 for x in xs], [row[3][0] for row in rows], 0.4, label="whole-video cache")
    bars.bar([x + 0.2 for x in xs], [row[2][0] for row in rows], 0.4, label="Iris (per group)")
    bars.set_xticks(list(xs), names)
    bars.set_ylabel("frame groups encoded")
    bars.legend()
    stream = next(row for row in rows if row[0] == "stream")
    windows = range(1, len(stream[2][2]) + 1)
    lines.plot(windows, stream[3][2], marker="o", label="whole-video cache")
    lines.plot(windows, stream[2][2], marker="o", label="Iris (per group)")
    lines.set_xlabel("stream window (75 % overlap)")
    lines.set_ylabel("groups encoded so far")
    lines.legend()
    stamp(fig, "tiny Qwen3-VL")
    return save(fig, path)


def _probe(url: str, stop: threading.Event, out: list[float]) -> None:
    with httpx.Client(timeout=60) as client:
        while not stop.is_set():
            started = time.monotonic()
            client.get(url + "/healthz")
            out.append(time.monotonic() - started)
            time.sleep(0.005)


def _p(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q / 100 * len(ordered)))]


def _quiet_median(url: str, seconds: float = 3.0) -> float:
    quiet: list[float] = []
    stop = threading.Event()
    timer = threading.Timer(seconds, stop.set)
    timer.start()
    _probe(url, stop, quiet)
    return statistics.median(quiet)


def loop_lag(
    platform: Platform, model: str, requests: list[Request | None], senders: int = 3
) -> tuple[float, float]:
    """(p99, worst) of /healthz probes while `requests` arrive from `senders` threads, each
    request under a salt of its own (the same salts on every call: a second call finds
    every group cached, and the gateway still decodes, samples and hashes every video). A
    None request is a text-only chat: the same traffic without its video, for comparison."""
    url = platform.gateway_url
    probes: list[float] = []
    stop = threading.Event()
    prober = threading.Thread(target=_probe, args=(url, stop, probes))
    prober.start()

    def send(index: int) -> None:
        with httpx.Client(base_url=url, timeout=300) as client:
            request = requests[index % len(requests)]
            if request is None:
                body = _body(model, Request(b"", QUESTIONS[0]), f"lag-{index}")
                body["messages"][0]["content"] = QUESTIONS[0]
            else:
                body = _body(model, request, f"lag-{index}")
            client.post("/v1/chat/completions", json=body).raise_for_status()

    with ThreadPoolExecutor(senders) as pool:
        list(pool.map(send, range(len(requests))))
    stop.set()
    prober.join()
    return _p(probes, 99), max(probes)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, default=None, help="default: tiny Qwen3-VL")
    parser.add_argument("--source-seconds", type=int, default=40, help="the stream's length")
    parser.add_argument("--window", type=int, default=8, help="seconds per clip (4 x stride)")
    parser.add_argument("--codec", choices=("mjpeg", "ffv1"), default="mjpeg")
    args = parser.parse_args()
    if args.window % 4:
        parser.error("--window must be a multiple of 4 (windows overlap by 75 %)")
    model = args.model
    if model is None:
        from iris.models.build import cached_tiny

        model = cached_tiny("qwen3_vl", ROOT / ".cache" / "models")
    name = Path(model).name
    loads = workloads(args.source_seconds, args.window, args.codec)
    config = UpConfig(model_dir=model, torch_threads=1)
    with Platform(config) as platform:
        # Warm the encoder and the pod (their first calls compile and allocate).
        warm = Request(encode_video(source_frames(8, seed=99), fps=SOURCE_FPS), QUESTIONS[0])
        with httpx.Client(base_url=platform.gateway_url, timeout=300) as client:
            client.post("/v1/chat/completions", json=_body(name, warm, "warmup"))
        rows = []
        for workload, requests in loads.items():
            iris = run_workload(platform, name, workload, requests, baseline=False)
            base = run_workload(platform, name, workload, requests, baseline=True)
            rows.append((workload, len(requests), iris, base))
        decode = scrape(metrics_url(platform.service("gateway")))
        quiet = _quiet_median(platform.gateway_url)
        lag_requests = loads["stream"] + loads["distinct"]
        cold = loop_lag(platform, name, lag_requests)  # every group encoded
        warm_lag = loop_lag(platform, name, lag_requests)  # every group cached
        text_lag = loop_lag(platform, name, [None] * len(lag_requests))
        decode_after = scrape(metrics_url(platform.service("gateway")))
    print(
        "workload       requests  groups iris / baseline  (iris %)   encoder CPU-s iris / baseline"
    )
    for workload, count, (groups, seconds, _), (base_groups, base_seconds, _) in rows:
        share = 100 * groups / base_groups if base_groups else 0.0
        print(
            f"{workload:<14} {count:>8}  {groups:>6.0f} / {base_groups:<8.0f}  ({share:5.1f} %)"
            f"   {seconds:8.2f} / {base_seconds:.2f}"
        )
    stream = next(row for row in rows if row[0] == "stream")
    share = stream[2][0] / stream[3][0]
    print(f"stream: Iris encodes {100 * share:.1f} % of the baseline's groups (target <= 30 %)")
    print(f"plot: {plot(rows)}")
    decode_s = decode_after.get("iris_gateway_video_decode_seconds_sum", 0.0)
    video_s = decode_after.get("iris_gateway_video_seconds_total", 0.0)
    videos = decode_after.get("iris_gateway_video_decode_seconds_count", 0.0)
    print(
        f"gateway decode: {1000 * decode_s / video_s:.1f} ms per second of video "
        f"({videos:.0f} videos, {video_s:.0f} s of video, {args.codec} "
        f"96x64 at {SOURCE_FPS} fps)"
    )
    lag_videos = (videos - decode.get("iris_gateway_video_decode_seconds_count", 0.0)) / 2
    for label, (p99, worst) in (
        ("videos arrive, groups encoded", cold),
        ("videos arrive, groups cached", warm_lag),
        ("text-only chats arrive (no video, for comparison)", text_lag),
    ):
        print(
            f"loop lag while {lag_videos:.0f} {label} (3 senders): p99 "
            f"{1000 * p99:.1f} ms = {p99 / quiet:.1f}x, worst {1000 * worst:.1f} ms = "
            f"{worst / quiet:.1f}x the quiet /healthz median ({1000 * quiet:.2f} ms)"
        )


if __name__ == "__main__":
    main()
