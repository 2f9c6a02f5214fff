"""`iris up` itself: prints the gateway URL first, answers the demo request with an image,
restarts a service that is killed (on its own port), and on SIGTERM / Ctrl-C stops every
process it started (no orphans), a restart in flight included."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from iris.up.processes import wait_until
from tests.e2e.helpers import image_message, image_png
from tests.fixtures.platform import LAZY_GRAMMAR

pytestmark = pytest.mark.slow


def descendants(pid: int) -> set[int]:
    found, stack = set(), [pid]
    while stack:
        current = stack.pop()
        for task in Path(f"/proc/{current}/task").glob("*"):
            children = (task / "children").read_text().split() if task.exists() else []
            for child in map(int, children):
                if child not in found:
                    found.add(child)
                    stack.append(child)
    return found


def alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except (FileNotFoundError, IndexError):
        return False


def read_until(process: subprocess.Popen, marker: str, lines: list[str]) -> bool:
    for line in process.stdout:
        lines.append(line)
        if marker in line:
            return True
    return False


def iris_up(model_dir, *flags, log_dir) -> subprocess.Popen:
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "iris.cli",
            "up",
            "--model",
            str(model_dir),
            "--log-dir",
            str(log_dir),
            *flags,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        # Its pods start their grammar workers lazily, as the suite's platforms do
        # (tests/fixtures/platform.py's LAZY_GRAMMAR): nothing here compiles a grammar.
        env={**os.environ, **LAZY_GRAMMAR, "PYTHONUNBUFFERED": "1"},
    )


def test_demo_request_is_answered_and_everything_stops(tmp_path, tiny_qwen2_vl_dir):
    process = iris_up(tiny_qwen2_vl_dir, "--demo-request", "--exit-after-demo", log_dir=tmp_path)
    output, _ = process.communicate(timeout=300)
    assert process.returncode == 0, output
    urls = re.findall(r"https?://[\w.:]+", output)
    assert urls and urls[0].startswith("http://127.0.0.1:"), output
    assert "Iris is up: " + urls[0] in output
    assert output.count("demo request: ") == 2 and "usage" in output, output


def test_several_gateways_are_printed_and_each_serves_and_sigterm_stops_every_service(
    tmp_path, tiny_qwen2_vl_dir
):
    """One `iris up` with two pods and two gateways: both gateways are printed and serve,
    and SIGTERM stops every process it started."""
    process = iris_up(tiny_qwen2_vl_dir, "--llm-pods", "2", "--gateways", "2", log_dir=tmp_path)
    lines: list[str] = []
    try:
        assert read_until(process, "Ctrl-C to stop", lines), "".join(lines)
        output = "".join(lines)
        (first,) = re.findall(r"Iris is up: (http://[\w.:]+)", output)
        (second,) = re.findall(r"another gateway: (http://[\w.:]+)", output)
        assert first != second
        for url in (first, second):
            assert httpx.get(f"{url}/v1/models", timeout=10).status_code == 200
        children = descendants(process.pid)
        assert len(children) >= 6, (children, lines)  # cache, encoder, 2 pods, 2 gateways
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=60)
        assert wait_until(lambda: not any(alive(pid) for pid in children), 15)
    finally:
        if process.poll() is None:
            process.kill()


def group_members(pgid: int) -> list[int]:
    """The live processes of process group `pgid`."""
    members = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[0] != "Z" and int(fields[2]) == pgid:
            members.append(int(stat.parent.name))
    return members


def command_line(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_text().replace("\0", " ")
    except FileNotFoundError:
        return ""


def test_sigint_during_startup_stops_it_there(tmp_path, tiny_qwen2_vl_dir):
    process = iris_up(tiny_qwen2_vl_dir, "--llm-pods", "2", log_dir=tmp_path)
    lines: list[str] = []
    try:
        assert read_until(process, "logs: ", lines), lines  # printed before anything starts
        assert wait_until(lambda: len(descendants(process.pid)) >= 3, 30), lines
        children = descendants(process.pid)
        process.send_signal(signal.SIGINT)  # the pods take seconds to load: still starting
        output, _ = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
    output = "".join(lines) + output
    assert process.returncode == 130, output
    assert "Iris is up" not in output and "interrupted while starting" in output, output
    assert wait_until(lambda: not any(alive(pid) for pid in children), 15)


def served_until(predicate, timeout_s: float = 90) -> bool:
    """Poll a request until it succeeds (a restarted peer's channel reconnects with gRPC's
    own backoff)."""

    def once() -> bool:
        try:
            return predicate()
        except httpx.HTTPError:
            return False

    return wait_until(once, timeout_s, 0.5)


def test_a_killed_service_is_restarted_on_its_port_and_ctrl_c_stops_a_restart_in_flight(
    tmp_path, tiny_qwen2_vl_dir
):
    process = iris_up(tiny_qwen2_vl_dir, log_dir=tmp_path)
    lines: list[str] = []
    try:
        assert read_until(process, "Ctrl-C to stop", lines), lines
        url = re.search(r"Iris is up: (\S+)", "".join(lines)).group(1)
        model = tiny_qwen2_vl_dir.name

        def chat(messages) -> bool:
            body = {"model": model, "messages": messages, "max_tokens": 2, "temperature": 0}
            reply = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=60)
            return reply.status_code == 200

        for role, request in (
            ("encoder", lambda: chat(image_message(image_png(seed=4242)))),
            ("llm", lambda: chat([{"role": "user", "content": "Hello again"}])),
            ("gateway", lambda: httpx.get(f"{url}/v1/models", timeout=10).status_code == 200),
        ):
            by_role = {command_line(pid).split()[-1]: pid for pid in descendants(process.pid)}
            os.kill(by_role[role], signal.SIGKILL)  # the service alone, not its group
            name = f"{role}-0" if role != "gateway" else "gateway"
            assert read_until(process, f"{name} serves again", lines), lines
            assert process.poll() is None
            assert served_until(request), (role, lines[-6:])  # same address as before
            # What it started (the gateway's parse pool) ended with it: each service leads
            # its own process group.
            killed = by_role[role]
            assert wait_until(lambda k=killed: not group_members(k), 15), (role, killed)
        output = "".join(lines)
        assert re.search(r"llm-0 exited with code -9; its log: \S+llm-0\.log", output), output
        assert "restarting encoder-0 in 1.0 s" in output, output
        assert re.search(r"restarted gateway \(pid \d+, restart 1 in 60 s\)", output), output

        # A restart in flight (the pod is loading again) stops with everything on Ctrl-C.
        by_role = {command_line(pid).split()[-1]: pid for pid in descendants(process.pid)}
        os.kill(by_role["llm"], signal.SIGKILL)
        assert read_until(process, "restarted llm-0", lines), lines
        children = descendants(process.pid)
        process.send_signal(signal.SIGINT)
        output, _ = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 0, "".join(lines) + output
    assert wait_until(lambda: not any(alive(pid) for pid in children), 15)


def test_a_service_that_cannot_start_is_named_without_a_traceback(tmp_path):
    empty_model = tmp_path / "no-weights"
    empty_model.mkdir()
    process = iris_up(empty_model, log_dir=tmp_path / "logs")
    output, _ = process.communicate(timeout=120)
    assert process.returncode == 1, output
    assert "the platform did not start" in output and "its log: " in output, output
    assert "Traceback (most recent call last)" not in output.split("did not start")[0]


def test_a_redis_server_that_fails_is_caught_before_iris_is_up(tmp_path, tiny_qwen2_vl_dir):
    real = shutil.which("redis-server")
    if real is None:
        pytest.skip("redis-server is not installed (scripts/setup.sh installs it)")
    fake_bin = tmp_path / "bin"
    fake_bin.mkdir()
    broken = fake_bin / "redis-server"  # the real server, refusing a bad setting at start
    broken.write_text(f'#!/bin/sh\nexec {real} "$@" --maxmemory bogus\n')
    broken.chmod(0o755)
    process = subprocess.Popen(
        [sys.executable, "-m", "iris.cli", "up", "--model", str(tiny_qwen2_vl_dir)]
        + ["--cache", "redis", "--log-dir", str(tmp_path / "logs")],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "PATH": f"{fake_bin}:{os.environ['PATH']}"},
    )
    output, _ = process.communicate(timeout=120)
    assert process.returncode == 1, output
    assert "redis exited with code" in output and "Iris is up" not in output, output
