"""A rank that hangs (SIGSTOP) while the engine idles is found by rank 0's pings within
the group's timeout: the failure names the rank, `on_failure` is called (the pod exits
there), and a later step raises RankFailedError instead of waiting."""

from __future__ import annotations

import os
import signal
import threading

import pytest

from llm_svc.engine import EngineConfig, LLMEngine, SamplingParams
from llm_svc.engine.parallel.group import RankFailedError

TIMEOUT_S = 5.0  # short, and only ever waited out by the hung rank: the engine is idle


def test_a_hung_rank_is_named_and_fails_the_engine(llama_dir):
    config = EngineConfig(
        llama_dir, page_size=4, num_pages=32, device="cpu", dtype="float32",
        tensor_parallel_size=2, tensor_parallel_timeout_s=TIMEOUT_S,
    )  # fmt: skip
    engine = LLMEngine(config)
    failed, messages = threading.Event(), []
    engine.runner.on_failure = lambda message: (messages.append(message), failed.set())
    (pid,) = engine.runner.ranks.pids.values()
    try:
        os.kill(pid, signal.SIGSTOP)
        # A guard against a hang only: the ping that finds it waits at most TIMEOUT_S.
        assert failed.wait(60), "the hung rank was never noticed"
        assert "rank(s) 1 alive but did not answer" in messages[0], messages
        engine.add_request("r", [1, 2, 3], SamplingParams(max_tokens=2))
        with pytest.raises(RankFailedError, match="rank"):
            while engine.has_unfinished():
                engine.step()
    finally:
        os.kill(pid, signal.SIGKILL)
        engine.close()
