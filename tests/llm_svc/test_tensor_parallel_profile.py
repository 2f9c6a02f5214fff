"""Under tensor parallelism the memory budget's profiling step runs its collectives on the
start group (START_TIMEOUT_S, 300 s), not on the step groups (the step timeout, 60 s by
default): one rank may reach the profile while another still loads its weights
(docs/design/engine.md, "Memory budget"; issue 43).

The profile runs only on CUDA, where the step group is NCCL; no GPU here, so the process
groups are recording fakes of one rank (a real gloo group cannot tell which of two groups
an exchange went through), on a real ShardRunner and the real profiling step on the CPU.
"""

from __future__ import annotations

from datetime import timedelta

import torch

from llm_svc.engine import EngineConfig
from llm_svc.engine.kv_sizing import profile_step
from llm_svc.engine.parallel.group import RankGroup
from llm_svc.engine.parallel.runner import ShardRunner
from llm_svc.engine.sampling_params import SamplingParams
from llm_svc.engine.scheduler import ScheduledChunk
from llm_svc.engine.sequence import Sequence


class _Done:
    def wait(self) -> bool:
        return True


class RecordingGroup:
    """A process group of one rank (each collective leaves its tensors as they are, as one
    rank's would) that notes `(name, collective)` in a shared log."""

    def __init__(self, name: str, log: list) -> None:
        self.name, self.log = name, log

    def allreduce(self, tensors, options=None) -> _Done:
        self.log.append((self.name, "allreduce"))
        return _Done()

    def broadcast(self, tensors, options=None) -> _Done:
        self.log.append((self.name, "broadcast"))
        return _Done()

    def allgather(self, outputs, inputs) -> _Done:
        self.log.append((self.name, "allgather"))
        for out in outputs[0]:
            out.copy_(inputs[0])
        return _Done()


def _runner(llama_dir, log):
    group = RankGroup(
        0, 1, torch.device("cpu"), None, RecordingGroup("start", log),
        RecordingGroup("step host", log), RecordingGroup("step tensors", log), timedelta(60),
    )  # fmt: skip
    config = EngineConfig(llama_dir, page_size=4, num_pages=16, max_num_batched_tokens=24,
                          max_num_seqs=4, device="cpu", dtype="float32")  # fmt: skip
    return ShardRunner(config, group), config


def test_the_profiling_steps_collectives_run_on_the_start_group(llama_dir):
    log: list = []
    runner, config = _runner(llama_dir, log)
    log.clear()
    step = profile_step(runner, config)
    assert step.tokens == 24
    during, after = log[:-1], log[-1]
    # Each layer's two row-parallel all-reduces, the embedding's, and the logits' gather.
    layers = runner.model_config.num_layers
    assert during.count(("start", "allreduce")) == 2 * layers + 1
    assert during.count(("start", "allgather")) == 1
    assert set(during) == {("start", "allreduce"), ("start", "allgather")}
    # Then one exchange brings up the step group (NCCL's buffers count in `other`).
    assert after == ("step tensors", "allreduce")


def test_steps_after_the_profile_use_the_step_group(llama_dir):
    log: list = []
    runner, config = _runner(llama_dir, log)
    profile_step(runner, config)
    log.clear()
    seq = Sequence("s", list(range(3, 11)), SamplingParams(max_tokens=1))
    seq.block_table = [0, 1]
    logits = runner.execute(runner.prepare([ScheduledChunk(seq, 0, seq.num_tokens)]))
    assert logits.shape == (1, runner.model_config.vocab_size)
    assert log and {name for name, _ in log} == {"step tensors"}
