"""`iris up --tensor-parallel-size 2`: a chat with an image is answered by a pod of two
rank processes; killing the second rank ends the pod (exit code 3, the rank named in its
log), and stopping `iris up` leaves no rank behind."""

from __future__ import annotations

import os
import re
import signal
import threading

import httpx
import pytest

from iris.up.processes import wait_until
from llm_svc.server.builder import RANK_FAILED_EXIT
from tests.e2e.helpers import image_message, image_png
from tests.e2e.test_iris_up import alive, command_line, descendants, iris_up, read_until

pytestmark = pytest.mark.slow
HANG_GUARD_S = 300


def test_chat_with_an_image_on_two_ranks_and_a_killed_rank_ends_the_pod(
    tmp_path, tiny_qwen2_vl_dir
):
    process = iris_up(tiny_qwen2_vl_dir, "--tensor-parallel-size", "2", log_dir=tmp_path)
    # A guard against a hang only (a pod that never exits would block the reads below).
    guard = threading.Timer(HANG_GUARD_S, process.kill)
    guard.start()
    lines: list[str] = []
    try:
        assert read_until(process, "Ctrl-C to stop", lines), lines
        url = re.search(r"Iris is up: (\S+)", "".join(lines)).group(1)
        body = {
            "model": tiny_qwen2_vl_dir.name,
            "messages": image_message(image_png(seed=36)),
            "max_tokens": 4,
            "temperature": 0,
        }
        reply = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=120)
        assert reply.status_code == 200, reply.text
        assert reply.json()["usage"]["completion_tokens"] > 0

        by_role = {command_line(pid).split()[-1]: pid for pid in descendants(process.pid)}
        pod = by_role["llm"]
        ranks = [pid for pid in descendants(pod) if "spawn_main" in command_line(pid)]
        assert len(ranks) == 1, [command_line(pid) for pid in descendants(pod)]
        os.kill(ranks[0], signal.SIGKILL)
        # The pod notices its rank's exit (not a timeout) and exits; the supervisor says so.
        assert read_until(process, f"llm-0 exited with code {RANK_FAILED_EXIT}", lines), lines
        log = (tmp_path / "llm-0.log").read_text()
        assert "tensor-parallel rank 1 exited with code -9" in log, log[-2000:]
        children = descendants(process.pid)
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=60)
    finally:
        guard.cancel()
        if process.poll() is None:
            process.kill()
    assert wait_until(lambda: not any(alive(pid) for pid in children), 15)
