"""`iris up` itself: prints the gateway URL first, answers the demo request with an image,
and on SIGTERM stops every process it started (no orphans)."""

from __future__ import annotations

import os
import re
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
        for line in process.stdout:
            lines.append(line)
            if "Ctrl-C to stop" in line:
                break
        children = descendants(process.pid)
        assert len(children) >= 5, (children, lines)  # cache, encoder, 2 pods, gateway
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=60)
        assert wait_until(lambda: not any(alive(pid) for pid in children), 15)
    finally:
        if process.poll() is None:
            process.kill()
