"""Gateway overhead per request with a ~1 MB image: everything the gateway does before the
LLM pod — base64 decode, header read under the decode policy, BLAKE3 identity, chat
template, tokenize, expand, pad, block hashes and the routing chain over two pods (one
holding a prefix from KV events) — model and network excluded. Also BLAKE3 hashing
throughput, and side by side in the same run how much of the overhead each step takes.

    .venv/bin/python bench/gateway.py [--requests 300] [--image-mb 1.0] [--model DIR]

On the demo model by default (its tokenizer, template and image expansion), whose measured
cost split (tower per tile, LM prefill per image) it prints first, for scale.

Prints `p50 X ms`, `p99 Y ms`, `hashing Z GB/s`, and per-step medians with their share.
Targets (issue 10): p50 <= 3 ms, hashing >= 3 GB/s.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import io
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
from PIL import Image  # noqa: E402

from gateway.intake.prompt import PromptBuilder  # noqa: E402
from gateway.intake.remote import RemoteImageFetcher  # noqa: E402
from gateway.intake.sources import decode_base64_image  # noqa: E402
from gateway.routing.config import load_router_config  # noqa: E402
from gateway.routing.kv_index import KVIndex  # noqa: E402
from gateway.routing.plugins.base import RoutingRequest  # noqa: E402
from gateway.routing.pods import Pod  # noqa: E402
from gateway.routing.router import Router  # noqa: E402
from iris.multimodal import (  # noqa: E402
    DecodePolicy,
    block_hashes,
    image_identity,
    read_image_header,
)


def noise_image(target_bytes: int, seed: int, fmt: str) -> bytes:
    """An image of random pixels (barely compressible) of about `target_bytes`."""
    per_pixel = 3.0 if fmt == "PNG" else 0.9  # JPEG at quality 90 on noise
    side = int((target_bytes / per_pixel) ** 0.5)
    pixels = np.random.default_rng(seed).integers(0, 256, (side, side, 3), dtype=np.uint8)
    buffer = io.BytesIO()
    options = {"compress_level": 1} if fmt == "PNG" else {"quality": 90}
    Image.fromarray(pixels).save(buffer, fmt, **options)
    return buffer.getvalue()


def percentile(values: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(values), q))


def hashing_gbps(fingerprint: bytes, size_mb: int = 64, repeats: int = 5) -> float:
    data = np.random.default_rng(0).bytes(size_mb << 20)
    best = min(_time(lambda: image_identity(data, fingerprint)) for _ in range(repeats))
    return len(data) / best / 1e9


def _time(call) -> float:
    start = time.perf_counter()
    call()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--image-mb", type=float, default=1.0)
    parser.add_argument("--format", choices=["PNG", "JPEG"], default="PNG")
    parser.add_argument("--model", type=Path, default=None, help="default: the demo model")
    args = parser.parse_args()

    from bench.cost_split import demo_dir, print_cost_split
    from iris.models import load_adapter

    model_dir = args.model or demo_dir()
    print_cost_split(model_dir, "model")
    adapter = load_adapter(model_dir)
    policy = DecodePolicy()
    fetcher = RemoteImageFetcher(enabled=False, allow_list=[], max_bytes=1, timeout_s=1)
    builder = PromptBuilder(adapter, policy=policy, fetcher=fetcher, max_images=4)
    index = KVIndex()
    router = Router(load_router_config("prefix-aware"), index)
    pods = [Pod(f"10.0.0.{i}:50053", page_size=16, healthy=True) for i in (1, 2)]

    # Distinct images so nothing is cached between requests (as for new users' images).
    images = [noise_image(int(args.image_mb * 1e6), seed, args.format) for seed in range(8)]
    mime = f"image/{args.format.lower()}"
    urls = [f"data:{mime};base64," + base64.b64encode(image).decode() for image in images]
    text = "What is in this image? Describe it in detail, with colours and positions."

    def messages(i: int) -> list[dict]:
        return [
            {"role": "system", "content": "You are a helpful assistant."},
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": text},
                    {"type": "image_url", "image_url": {"url": urls[i % len(urls)]}},
                ],
            },
        ]

    # One pod holds the first prompt's prefix (as a snapshot from its KV events would say).
    first = asyncio.run(builder.chat(messages(0)))
    index.load_snapshot(pods[1].address, 0, block_hashes(adapter.fingerprint, first.input_ids, 16))

    async def one(i: int) -> tuple[float, float]:
        start = time.perf_counter()
        prompt = await builder.chat(messages(i))
        prepared = time.perf_counter()
        router.route(RoutingRequest(prompt.input_ids, adapter.fingerprint), pods)
        end = time.perf_counter()
        return end - start, end - prepared

    async def run() -> tuple[list[float], list[float]]:
        for i in range(20):  # warm-up: tokenizer caches, template compilation
            await one(i)
        totals, routes = [], []
        for i in range(args.requests):
            total, route = await one(i)
            totals.append(total)
            routes.append(route)
        return totals, routes

    totals, routes = asyncio.run(run())

    # The steps alone, side by side in this run, on the same images.
    payload = urls[0].partition(",")[2]
    steps = {
        "base64 decode": lambda: decode_base64_image(payload, 1 << 30, "p"),
        "header": lambda: read_image_header(images[0], policy),
        "identity (BLAKE3)": lambda: image_identity(images[0], adapter.fingerprint),
        "template+tokenize": lambda: adapter.encode_prompt(
            adapter.apply_chat_template([{"role": "user", "content": text}])
        ),
    }
    medians = {
        name: statistics.median(_time(call) for _ in range(100)) for name, call in steps.items()
    }
    medians["route"] = statistics.median(routes)
    p50, p99 = percentile(totals, 50), percentile(totals, 99)
    gbps = hashing_gbps(adapter.fingerprint)

    print(
        f"{args.format} image {len(images[0]) / 1e6:.2f} MB, {first.image_tokens} image tokens, "
        f"{first.prompt_tokens} prompt tokens, {args.requests} requests"
    )
    print(f"p50 {p50 * 1e3:.2f} ms")
    print(f"p99 {p99 * 1e3:.2f} ms")
    print(f"hashing {gbps:.2f} GB/s (BLAKE3 identity over 64 MB)")
    for name, value in medians.items():
        print(f"  {name:<20} {value * 1e3:7.3f} ms  {value / p50:6.1%} of p50")


if __name__ == "__main__":
    main()
