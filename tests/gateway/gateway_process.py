"""A real `iris gateway` process on loopback, for the tests that need the real door (uvicorn,
the HTTP protocol subclass) rather than an in-process app."""

from __future__ import annotations

import sys

import httpx

from iris.up.processes import ChildProcess, wait_until


def start_gateway(env: dict[str, str], port: int, log_path) -> tuple[ChildProcess, str]:
    """Start `iris gateway` with `env` and wait until /readyz answers 200; (child, its URL).
    The child is stopped again if it never becomes ready."""
    child = ChildProcess("gateway", [sys.executable, "-m", "iris.cli", "gateway"], env, log_path)
    child.start()
    url = f"http://127.0.0.1:{port}"

    def ready() -> bool:
        try:
            return httpx.get(url + "/readyz", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    try:
        assert wait_until(ready, 60, 0.2), child.tail()
    except BaseException:
        child.stop()
        raise
    return child, url
