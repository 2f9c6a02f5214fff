"""What the gateway's event loop pays for a large body: parsed on the loop, or in a parse
worker process and taken back (gateway/parsing/). No gateway, no network: one event loop,
a ticker on it that notes its longest wait between ticks (1 ms apart), and each of
bench/hostile.py's heavy bodies parsed (a) as FastAPI would, on the loop, and (b) by the
gateway's BodyParser: (b) the body joined and pickled through the pool's pipe, (c) as the
gateway does, written into shared memory chunk by chunk as it arrives; the outcome read
back on a worker thread frame by frame. With the switch interval the gateway sets (1 ms).

    python bench/parse_receive.py [--rounds 5]

Prints per body its size and the loop's longest wait in each mode (the worst of the
rounds), and `parse: loop's longest wait, in process X ms (worst body), via the pool Y ms`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT)]

from bench.hostile import SECTIONS  # noqa: E402
from gateway.api.schemas import ChatCompletionRequest, CompletionRequest  # noqa: E402
from gateway.parsing.pool import BodyParser  # noqa: E402
from gateway.parsing.shared_body import BodyBuffer  # noqa: E402

CHUNK = 65536  # what uvicorn hands the app per receive()


class Ticker:
    """The loop's longest wait between two 1 ms sleeps, while `watching`."""

    def __init__(self) -> None:
        self.worst = 0.0

    async def watch(self, stop: asyncio.Event) -> None:
        last = time.perf_counter()
        while not stop.is_set():
            await asyncio.sleep(0.001)
            now = time.perf_counter()
            self.worst = max(self.worst, now - last - 0.001)
            last = now


async def _worst_wait(work) -> float:
    ticker, stop = Ticker(), asyncio.Event()
    watching = asyncio.create_task(ticker.watch(stop))
    await asyncio.sleep(0.005)
    with contextlib.suppress(Exception):  # a refusal is an outcome like any other here
        await work()
    await asyncio.sleep(0.005)
    stop.set()
    await watching
    return ticker.worst


async def main(rounds: int) -> None:
    sys.setswitchinterval(0.001)
    parser = BodyParser(workers=2, in_process_max_bytes=0)
    parser.start()
    await asyncio.sleep(3)  # the processes spawn
    heavies = [
        h for section in ("bounds", "schemas", "nesting", "images") for h in SECTIONS[section]("m")
    ]
    worst_loop = worst_pipe = worst_pool = 0.0
    for heavy in heavies:
        model = (
            ChatCompletionRequest if heavy.path.endswith("chat/completions") else CompletionRequest
        )

        async def on_loop(body=heavy.body, model=model):
            model.model_validate(json.loads(body), from_attributes=True)

        async def via_pipe(body=heavy.body, model=model):
            # The chunks joined, the body pickled to the worker through the pool's pipe.
            chunks = [body[i : i + CHUNK] for i in range(0, len(body), CHUNK)]
            await asyncio.sleep(0)
            await parser.parse(model, b"".join(chunks))

        async def via_shared(body=heavy.body, model=model):
            # As the gateway does: each chunk into shared memory as it arrives.
            buffer = BodyBuffer(0, len(body), expected=len(body))
            try:
                for i in range(0, len(body), CHUNK):
                    await buffer.add(body[i : i + CHUNK])
                    await asyncio.sleep(0)
                await parser.parse(model, buffer.body())
            finally:
                buffer.release()

        loop_ms = pipe_ms = pool_ms = 0.0
        for _ in range(rounds):
            loop_ms = max(loop_ms, await _worst_wait(on_loop) * 1000)
            pipe_ms = max(pipe_ms, await _worst_wait(via_pipe) * 1000)
            pool_ms = max(pool_ms, await _worst_wait(via_shared) * 1000)
        worst_loop, worst_pool = max(worst_loop, loop_ms), max(worst_pool, pool_ms)
        worst_pipe = max(worst_pipe, pipe_ms)
        print(
            f"  {heavy.label:28s} {len(heavy.body) / 1e6:6.2f} MB: on the loop "
            f"{loop_ms:6.1f} ms, pool (body in the pipe) {pipe_ms:5.1f} ms, "
            f"pool (shared memory) {pool_ms:5.1f} ms"
        )
    await parser.stop()
    print(
        f"parse: loop's longest wait, in process {worst_loop:.1f} ms (worst body), "
        f"pool with the body in the pipe {worst_pipe:.1f} ms, in shared memory {worst_pool:.1f} ms"
    )


if __name__ == "__main__":
    cli = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    cli.add_argument("--rounds", type=int, default=5)
    asyncio.run(main(cli.parse_args().rounds))
