"""A service freezes its startup heap once started (iris/heap.py), through the entry point
every gRPC service runs (iris.service_main.serve_with_tracing). Run in a child process: a
frozen heap is never collected again, which the test process must not suffer."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent(
    """
    import asyncio, gc, types
    from iris.service_main import serve_with_tracing

    class Server:
        async def start(self):
            self.frozen_at_start = gc.get_freeze_count()
        async def wait(self):
            self.frozen_while_serving = gc.get_freeze_count()
        async def stop(self):
            pass

    server = Server()
    settings = types.SimpleNamespace(otlp_endpoint=None)
    asyncio.run(serve_with_tracing("iris-test", settings, server))
    print(server.frozen_at_start, server.frozen_while_serving)
    """
)


def test_a_started_service_serves_with_its_startup_heap_frozen():
    result = subprocess.run(
        [sys.executable, "-c", SCRIPT],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "OTEL_EXPORTER_OTLP_ENDPOINT": ""},  # no exporter to reach
    )
    assert result.returncode == 0, result.stderr[-2000:]
    at_start, while_serving = map(int, result.stdout.split())
    assert at_start == 0
    assert while_serving > 10_000  # the imported libraries, at least
