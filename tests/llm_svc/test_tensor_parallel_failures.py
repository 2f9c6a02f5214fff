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


def test_rank_0_running_out_of_memory_mid_step_is_a_local_error_not_a_rank_failure(llama_dir):
    """Rank 0 runs out of memory inside a step, after the step went out and while rank 1
    waits in the step's collectives (injected at rank 0's second all-reduce, on gloo). The
    step raises the OutOfMemoryError itself, as at TP 1 (the engine thread then shrinks the
    step and prefills again); rank 1 drops the step; no rank failure is reported; the
    request, put back, produces the tokens it produces without the fault."""
    import torch

    config = EngineConfig(
        llama_dir, page_size=4, num_pages=32, device="cpu", dtype="float32",
        tensor_parallel_size=2, tensor_parallel_timeout_s=60.0,
    )  # fmt: skip
    engine = LLMEngine(config)
    messages: list[str] = []
    engine.runner.on_failure = messages.append
    params = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)
    group = engine.runner.group
    real_all_reduce, calls = group.all_reduce, []

    def all_reduce_out_of_memory_once(tensor):
        calls.append(1)
        if len(calls) == 2:
            raise torch.OutOfMemoryError("injected: rank 0 out of memory")
        return real_all_reduce(tensor)

    try:
        expected = _tokens_of(engine, "reference", params)
        engine.add_request("faulted", [7, 3, 9, 4, 2], params)
        group.all_reduce = all_reduce_out_of_memory_once
        with pytest.raises(torch.OutOfMemoryError, match="injected"):
            while engine.has_unfinished():
                engine.step()
        del group.all_reduce
        outputs = engine.recover(RuntimeError("out of memory"), recompute=True)
        assert messages == [] and engine.runner.failure is None
        while engine.has_unfinished():
            outputs += engine.step()
        tokens = [t for out in outputs if out.request_id == "faulted" for t in out.new_token_ids]
        assert tokens == expected
        assert _tokens_of(engine, "after", params) == expected  # the group serves on
    finally:
        engine.close()
    assert messages == []


def _tokens_of(engine, request_id: str, params) -> list[int]:
    engine.add_request(request_id, [7, 3, 9, 4, 2], params)
    tokens = []
    while engine.has_unfinished():
        for out in engine.step():
            tokens += out.new_token_ids
    return tokens


def test_a_failed_start_stops_the_ranks_and_restores_the_thread_count(llama_dir, monkeypatch):
    """Rank 0 fails while building its runner (injected in this process only: the other
    rank, spawned, is unaffected and waits for it): the error says so, the rank it started
    is gone at once (not left waiting out the start timeout), and torch's thread count is
    what it was."""
    import torch

    from llm_svc.engine.parallel import ranks as ranks_module
    from llm_svc.engine.parallel.runner import ShardRunner

    started = []
    real_init = ranks_module.RankProcesses.__init__

    def recording_init(self, *args, **kwargs):
        real_init(self, *args, **kwargs)
        started.append(self)

    def failing_pages(self, config):
        raise RuntimeError("injected: rank 0 cannot size its KV pages")

    monkeypatch.setattr(ranks_module.RankProcesses, "__init__", recording_init)
    monkeypatch.setattr(ShardRunner, "_num_pages", failing_pages)
    threads = torch.get_num_threads()
    config = EngineConfig(
        llama_dir, page_size=4, num_pages=32, device="cpu", dtype="float32",
        tensor_parallel_size=2, tensor_parallel_timeout_s=TIMEOUT_S,
    )  # fmt: skip
    with pytest.raises(RankFailedError, match="tensor-parallel start failed"):
        LLMEngine(config)
    (processes,) = started
    assert all(not process.is_alive() for process in processes.processes)
    assert torch.get_num_threads() == threads
