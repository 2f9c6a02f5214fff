"""Encoder service throughput against the naive path, measured side by side in one run.

Workload: N images (default 256), half of them duplicates of the other half, sent by 8
concurrent callers in small requests. Per model:

- naive: in-process, one runner call per image, no dedup (decode, preprocess, encode; no
  gRPC, no cache — the cheapest possible per-image path);
- service: the real encoder service (dynamic batching, dedup, preprocessing pool) as its own
  process on loopback, as deployed, storing every embedding in the cache service (memory
  store, its own process too); the callers run in this process. (Run in one process, the
  callers' and the cache's gRPC work shared the encoder's GIL and event loop.)

Prints images/s of both, `ratio R` (service / naive) and the dedup ratio the service
reports (tower calls and images encoded come from its /metrics), then the mean time an
encoded image spent in each of the service's stages (claim, prepare, batch wait, tower,
store: its `iris_encoder_stage_seconds` histogram). `--device cuda` runs both
paths on the GPU in bfloat16 (the service's own CUDA setting). Then, per model, the
measured cost of each stage per distinct image and the bound they put on R on this machine:
the naive run's time over the service's least work (each distinct image prepared and
encoded once, batched, on every core, with no gRPC, cache or load-generator cost).
Each model's line ends with R / bound; the last line, `ratio of bound: X`, is the smallest
over the models run (goal: 0.8). First, per model, its measured cost split (tower per tile,
LM prefill per image). The demo's tower (SigLIP-base, about a second a tile on one core) gets
a smaller workload (`--demo-images`) so that the default run fits in 15 minutes.

The service's tower runs with `--service-threads` torch threads (default: one a core, since
the bound gives the service every core; beside its `--preprocess-workers` threads); the
naive path stays on one thread, as the bound assumes. (On one thread the demo's tower,
where nearly all its work is, could use one core of two: R / bound 0.38 against 0.64.)
Run: .venv/bin/python -m bench.encoder [--models tiny-qwen2_vl,tiny-idefics3,demo]
"""

from __future__ import annotations

import argparse
import asyncio
import io
import os
import random
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image

CACHE_ROOT = Path(__file__).resolve().parents[1] / ".cache" / "models"
MODELS = ("tiny-qwen2_vl", "tiny-idefics3", "demo")
# Image sizes cycle through these (the gateway sees all kinds of sizes).
SIZES = [(200, 120), (96, 96), (150, 260), (320, 180), (120, 200), (256, 256), (64, 300)]


def model_dir(name: str) -> Path:
    from iris.models.build import cached_demo, cached_tiny

    if name == "demo":
        return cached_demo(CACHE_ROOT)
    return cached_tiny(name.removeprefix("tiny-"), CACHE_ROOT)


def png(seed: int, width: int, height: int) -> bytes:
    rng = np.random.default_rng(seed)
    out = io.BytesIO()
    Image.fromarray(rng.integers(0, 256, (height, width, 3), dtype=np.uint8)).save(out, "PNG")
    return out.getvalue()


def workload(images: int, duplicate_share: float, seed: int = 0) -> list[bytes]:
    """`images` image files, `duplicate_share` of them repeats of the others, shuffled."""
    unique = max(1, round(images * (1 - duplicate_share)))
    distinct = [png(seed * 100_000 + i, *SIZES[i % len(SIZES)]) for i in range(unique)]
    files = distinct + [distinct[i % unique] for i in range(images - unique)]
    random.Random(seed).shuffle(files)
    return files


def naive_images_per_s(runner, files: list[bytes]) -> float:
    from iris.multimodal import decode_image

    start = time.perf_counter()
    for data in files:
        runner.encode([runner.preprocess(decode_image(data))])
    synchronize(runner)
    return len(files) / (time.perf_counter() - start)


def synchronize(runner) -> None:
    """Wait for the runner's device (CUDA work is asynchronous; host clocks need this)."""
    import torch

    if torch.device(runner.device).type == "cuda":
        torch.cuda.synchronize(runner.device)


def stage_costs(runner, files: list[bytes], batch: int = 8) -> tuple[float, float, float]:
    """Seconds per distinct image of (decode + preprocess, a one-image tower call, a tower
    call in batches of `batch`), measured on the workload's distinct images."""
    from iris.multimodal import decode_image

    distinct = list(dict.fromkeys(files))
    start = time.perf_counter()
    prepared = [runner.preprocess(decode_image(data)) for data in distinct]
    prepare_s = (time.perf_counter() - start) / len(distinct)
    start = time.perf_counter()
    for one in prepared:
        runner.encode([one])
    synchronize(runner)
    single_s = (time.perf_counter() - start) / len(distinct)
    start = time.perf_counter()
    for first in range(0, len(prepared), batch):
        runner.encode(prepared[first : first + batch])
    synchronize(runner)
    batched_s = (time.perf_counter() - start) / len(distinct)
    return prepare_s, single_s, batched_s


def ratio_bound(
    files: list[bytes], naive_s: float, costs: tuple[float, float, float], cores: int
) -> float:
    """The most R can be here: the naive run R is measured against took `naive_s` per image
    on one core; the service must at least prepare and (batched) encode each distinct image
    once, spread over `cores` with no other cost (no gRPC, no cache, no load generator).

    The naive side is R's own naive run, not the stage costs' prepare + single call: with
    two measurements of the same per-image cost, load moving between them moved R / bound
    (it read above 1 on a busy machine)."""
    prepare_s, _, batched_s = costs
    distinct = len(set(files))
    return len(files) * naive_s * cores / (distinct * (prepare_s + batched_s))


def make_items(adapter, files: list[bytes]):
    from encoder_svc.proto import encoder_pb2
    from iris.multimodal import image_identity, read_image_header
    from iris.proto import common_pb2

    items = []
    for data in files:
        header = read_image_header(data)
        token_count, grid = adapter.image_token_count(header.width, header.height)
        item = common_pb2.MultimodalItem(
            modality=common_pb2.IMAGE,
            identity=image_identity(data, adapter.fingerprint),
            token_count=token_count,
            grid=list(grid),
        )
        items.append(encoder_pb2.EncodeItem(image=data, item=item))
    return items


async def call_encoder(address, adapter, files, callers: int, per_request: int) -> float:
    """Send `files` from `callers` concurrent callers; return the seconds it took."""
    import grpc

    from encoder_svc.proto import encoder_pb2, encoder_pb2_grpc

    items = make_items(adapter, files)
    shares = [items[caller::callers] for caller in range(callers)]
    channel = grpc.aio.insecure_channel(address)
    stub = encoder_pb2_grpc.EncoderStub(channel)

    async def caller(share) -> None:
        for start in range(0, len(share), per_request):
            request = encoder_pb2.EncodeRequest(
                items=share[start : start + per_request], fingerprint=adapter.fingerprint
            )
            reply = await stub.Encode(request)
            failed = [r.error for r in reply.results if not r.ok]
            if failed:
                raise RuntimeError(f"encode failed: {failed[0]}")

    try:
        begin = time.perf_counter()
        await asyncio.gather(*(caller(share) for share in shares))
        return time.perf_counter() - begin
    finally:
        await channel.close()


@dataclass
class ServiceRun:
    """What one service run measured: images/s, the dedup ratio, tower calls, images
    encoded, and the mean seconds an encoded image spent in each stage (its /metrics)."""

    images_per_s: float
    dedup: float
    calls: float
    encoded: float
    stage_s: dict[str, float]

    def stages_line(self) -> str:
        parts = ", ".join(f"{stage} {s * 1e3:.1f}" for stage, s in self.stage_s.items())
        return f"mean ms an encoded image spent in each stage: {parts}"


def service_run(adapter, model: Path, files, args) -> ServiceRun:
    """The encoder and cache services started as processes (`iris up`'s launcher), driven
    from here."""
    from encoder_svc.metrics import STAGES
    from iris.metrics import ENCODER_BATCH_SIZE, ENCODER_STAGE_SECONDS, LABEL_STAGE
    from iris.up.metrics_page import metrics_url, scrape
    from iris.up.platform import Platform, UpConfig

    config = UpConfig(
        model_dir=model,
        services=("cache", "encoder"),
        torch_threads=args.torch_threads,
        extra_env={
            "encoder": {
                "IRIS_ENCODER_MAX_WAIT_MS": str(args.wait_ms),
                "IRIS_ENCODER_MAX_QUEUE_VISION_TOKENS": str(1 << 24),
                "IRIS_ENCODER_MAX_ITEM_VISION_TOKENS": str(1 << 16),
                "IRIS_ENCODER_DEVICE": args.device,
                "IRIS_ENCODER_TORCH_THREADS": str(args.service_threads),
                "IRIS_ENCODER_PREPROCESS_WORKERS": str(args.preprocess_workers),
            }
        },
    )

    def read(page: str) -> dict[str, dict[str, float]]:
        pages = {stage: scrape(page, {LABEL_STAGE: stage}) for stage in STAGES}
        return {"": scrape(page), **pages}

    with Platform(config) as platform:
        (encoder,) = [s for s in platform.services if s.kind == "encoder"]
        page = metrics_url(encoder)
        warm = [png(999_998, 128, 128)]  # the service's first-call costs are not the workload's
        asyncio.run(call_encoder(encoder.address, adapter, warm, 1, 1))
        before = read(page)
        elapsed = asyncio.run(
            call_encoder(encoder.address, adapter, files, args.callers, args.per_request)
        )
        after = read(page)

    def grown(name: str, part: str = "") -> float:
        return after[part].get(name, 0.0) - before[part].get(name, 0.0)

    calls = grown(ENCODER_BATCH_SIZE + "_count")
    encoded = grown(ENCODER_BATCH_SIZE + "_sum")
    stage_s = {
        stage: grown(ENCODER_STAGE_SECONDS + "_sum", stage)
        / max(1.0, grown(ENCODER_STAGE_SECONDS + "_count", stage))
        for stage in STAGES
    }
    return ServiceRun(len(files) / elapsed, 1 - encoded / len(files), calls, encoded, stage_s)


def bench_model(name: str, args, drawn: list | None = None) -> float:
    """Run one model's comparison; returns R / bound (and appends what the plot needs to
    `drawn`: name, naive seconds per image, the naive path's stage costs, the service's)."""
    import torch

    from bench.cost_split import print_cost_split
    from iris.models import load_adapter
    from iris.multimodal import decode_image

    adapter = load_adapter(model_dir(name))
    print_cost_split(model_dir(name), name, device=args.device)
    # Both paths on the same device and dtype: the service runs bfloat16 on CUDA.
    dtype = torch.bfloat16 if args.device == "cuda" else torch.float32
    runner = adapter.vision_runner(device=args.device, dtype=dtype)
    files = workload(args.demo_images if name == "demo" else args.images, args.duplicates)
    warm = decode_image(png(999_999, 128, 128))
    runner.encode([runner.preprocess(warm)])  # first-call costs are not the workload's
    torch.set_num_threads(1)  # the naive path: one image at a time on one core
    naive = naive_images_per_s(runner, files)
    run = service_run(adapter, model_dir(name), files, args)
    served = run.images_per_s
    mean_batch = run.encoded / run.calls if run.calls else 0.0
    print(
        f"{name:14s} naive {naive:8.1f} img/s   service {served:8.1f} img/s   "
        f"ratio R {served / naive:5.2f}   dedup ratio {run.dedup:.3f}   tower calls "
        f"{run.calls:.0f} (mean batch {mean_batch:.1f}, images encoded {run.encoded:.0f})",
        flush=True,
    )
    print(f"{'':14s} {run.stages_line()}", flush=True)
    costs = stage_costs(runner, files)
    if drawn is not None:
        drawn.append((name, 1 / naive, costs, run.stage_s, run.images_per_s))
    cores = len(os.sched_getaffinity(0))
    bound = ratio_bound(files, 1 / naive, costs, cores)
    ratio = served / naive
    print(
        f"{'':14s} per distinct image: prepare {costs[0] * 1e3:.2f} ms, tower alone "
        f"{costs[1] * 1e3:.2f} ms, tower in batches of 8 {costs[2] * 1e3:.2f} ms "
        f"(batching gain {costs[1] / costs[2]:.2f}x); bound on R here with {cores} cores and "
        f"no overhead: {bound:.2f}; R / bound {ratio / bound:.2f}",
        flush=True,
    )
    if ratio > bound:
        print(
            f"{'':14s} R is above its bound, which no run can be on a machine to itself: the "
            "load from other processes moved between the measurements (an oversubscribed "
            "machine also gives the many-threaded service more of its cores than the naive "
            "path's one thread)",
            flush=True,
        )
    return ratio / bound


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--images", type=int, default=256)
    parser.add_argument("--demo-images", type=int, default=32, help="--images for the demo")
    parser.add_argument("--duplicates", type=float, default=0.5)
    parser.add_argument("--callers", type=int, default=8)
    parser.add_argument("--per-request", type=int, default=2)
    parser.add_argument("--wait-ms", type=float, default=5.0)
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument(
        "--torch-threads",
        type=int,
        default=1,
        help="torch intra-op threads of the stage-cost measurement and the cache service",
    )
    parser.add_argument(
        "--service-threads",
        type=int,
        default=os.cpu_count() or 1,
        help="torch intra-op threads of the encoder service's tower (default: every core, "
        "as the bound assumes; on a machine others load, more threads than free cores make "
        "each tower call slower)",
    )
    parser.add_argument("--preprocess-workers", type=int, default=2)
    args = parser.parse_args()
    import torch

    torch.set_num_threads(args.torch_threads)
    print(
        f"{args.images} images, {args.duplicates:.0%} duplicates, {args.callers} callers, "
        f"{args.per_request} images per request, max_wait {args.wait_ms} ms, "
        f"{args.torch_threads} torch thread(s), device {args.device}",
        flush=True,
    )
    drawn: list = []
    names = [name.strip() for name in args.models.split(",")]
    fractions = {name: bench_model(name, args, drawn) for name in names}
    worst = min(fractions, key=fractions.get)
    print(f"ratio of bound: {fractions[worst]:.2f}  (smallest R / bound, {worst}; goal 0.8)")
    print(f"wrote {plot(drawn, args)}")


def plot(drawn: list, args) -> Path:
    """Per model, the mean time an image spends in each stage: the naive path (prepare,
    tower: one image at a time) against the service (its stage histogram's means)."""
    from bench.plots import figure, save, stamp

    fig, axes = figure(1, len(drawn), size=(5.0 * len(drawn) + 1, 5.0))
    for axis, (name, naive_s, costs, stage_s, served) in zip(axes[0], drawn, strict=True):
        # The naive path's time per image split by its measured prepare cost (the rest is
        # the tower); the service's stages are its histogram's (claim, prepare, ...).
        bars = {
            "naive": [("prepare", costs[0]), ("tower", max(naive_s - costs[0], 0.0))],
            "service": list(stage_s.items()),
        }
        names = dict.fromkeys(stage for parts in bars.values() for stage, _ in parts)
        colours = dict(zip(names, plt_colours(), strict=False))
        for x, parts in enumerate(bars.values()):
            bottom = 0.0
            for stage, seconds in parts:
                axis.bar(x, seconds * 1e3, bottom=bottom, color=colours.get(stage), label=stage)
                bottom += seconds * 1e3
        handles, labels = axis.get_legend_handles_labels()
        unique = dict(zip(labels, handles, strict=True))
        axis.legend(unique.values(), unique.keys(), fontsize=7)
        axis.set_xticks([0, 1], [f"naive\n{1 / naive_s:.1f} img/s", f"service\n{served:.1f} img/s"])
        axis.set_ylabel("ms an image spends (mean)")
        axis.set_title(f"{name}: time per image by stage", fontsize=10)
        # The service's images overlap in time (batches, a preprocessing pool), so a longer
        # stay per image goes with more images per second.
    stamp(fig, ", ".join(name for name, *_ in drawn), f"device {args.device}")
    return save(fig, "encoder_stages.png")


def plt_colours() -> list[str]:
    return ["tab:olive", "tab:red", "tab:gray", "tab:green", "tab:purple", "tab:blue", "tab:orange"]


if __name__ == "__main__":
    main()
