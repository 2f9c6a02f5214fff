"""`iris up` itself: prints the gateway URL first, answers the demo request with an image,
and on SIGTERM stops every process it started (no orphans)."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from iris.up.processes import wait_until

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
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )


def test_demo_request_is_answered_and_everything_stops(tmp_path, tiny_qwen2_vl_dir):
    process = iris_up(tiny_qwen2_vl_dir, "--demo-request", "--exit-after-demo", log_dir=tmp_path)
    output, _ = process.communicate(timeout=300)
    assert process.returncode == 0, output
    urls = re.findall(r"https?://[\w.:]+", output)
    assert urls and urls[0].startswith("http://127.0.0.1:"), output
    assert "Iris is up: " + urls[0] in output
    assert output.count("demo request: ") == 2 and "usage" in output, output


def test_sigterm_stops_every_service(tmp_path, tiny_qwen2_vl_dir):
    process = iris_up(tiny_qwen2_vl_dir, "--llm-pods", "2", log_dir=tmp_path)
    lines = []
    try:
        read_until(process, "Ctrl-C to stop", lines)
        children = descendants(process.pid)
        assert len(children) >= 5, (children, lines)  # cache, encoder, 2 pods, gateway
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=60)
        assert wait_until(lambda: not any(alive(pid) for pid in children), 15)
    finally:
        if process.poll() is None:
            process.kill()


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


def test_a_service_that_exits_is_reported_and_a_lost_gateway_ends_iris_up(
    tmp_path, tiny_qwen2_vl_dir
):
    process = iris_up(tiny_qwen2_vl_dir, "--llm-pods", "2", log_dir=tmp_path)
    lines: list[str] = []
    try:
        assert read_until(process, "Ctrl-C to stop", lines), lines
        children = descendants(process.pid)
        by_role = {command_line(pid).split()[-1]: pid for pid in children}
        os.kill(by_role["llm"], signal.SIGKILL)  # one of two pods: reported, still serving
        assert read_until(process, "exited with code -9", lines), lines
        assert process.poll() is None
        os.kill(by_role["gateway"], signal.SIGKILL)
        output, _ = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
    output = "".join(lines) + output
    assert re.search(r"llm-\d exited with code -9; its log: \S+llm-\d\.log", output), output
    assert "gateway exited with code -9" in output, output
    assert process.returncode == 1, output
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
