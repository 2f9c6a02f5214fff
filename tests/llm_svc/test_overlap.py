"""Overlap scheduling (LLMEngine.step): with it on, every request's tokens, text, logprobs
and finish reason equal those with it off — greedy and seeded, penalties, stop strings and
stop ids, preemption, aborts and a constrained request among them — and a step waits for
the device once. On the CPU "waits" are counted by the hook every device read goes through
(transfer.DeviceToHost.wait), and any other read of a tensor during a step is caught."""

from __future__ import annotations

import pytest
import torch

from llm_svc.engine import SamplingParams
from llm_svc.engine.grammar import Constraint, ConstraintKind
from llm_svc.engine.transfer import host_syncs
from tests.llm_svc.conftest import greedy, make_engine, token_ids


def workload(stop_text: str) -> dict[str, tuple[list[int], SamplingParams]]:
    def sampled(seed, **extra):
        return SamplingParams(temperature=1.0, seed=seed, ignore_eos=True, **extra)

    return {
        "greedy": (list(range(5, 30)), greedy(20)),
        "greedy-lp": (list(range(40, 47)), greedy(9, logprobs=2)),
        "seeded": (list(range(7, 19)), sampled(1, max_tokens=17, top_p=0.9)),
        "seeded-pen": (list(range(3, 9)), sampled(2, max_tokens=15, repetition_penalty=1.3,
                                                  frequency_penalty=0.4, top_k=20)),  # fmt: skip
        "greedy-pen": (list(range(9, 21)), greedy(14, presence_penalty=1.0, min_p=0.1)),
        "stop-str": (list(range(5, 30)), greedy(20, stop=[stop_text])),
        "stop-id": (list(range(11, 23)), sampled(4, max_tokens=30, stop_token_ids=[7, 8, 9])),
        "long": ([2] * 40, sampled(5, max_tokens=24, logprobs=1)),
        "aborted": (list(range(60, 72)), sampled(6, max_tokens=30)),
        "json": ([5, 6, 7], SamplingParams(temperature=0.0, max_tokens=12,
                                           constraint=Constraint(ConstraintKind.JSON_OBJECT))),
    }  # fmt: skip


def run(engine, requests, abort_after: int = 3):
    """Step to the end; "aborted" is aborted once the host has seen `abort_after` of its
    tokens. Returns {id: (tokens, text, finish_reason, logprobs)} and the steps' counts."""
    for _, params in requests.values():
        if params.constraint is not None:
            # Compiled before the run: a request is held out of the batch while its grammar
            # compiles, so the step it joins at would follow the compile's speed, and with it
            # the others' batches (and their logits, in the last bits).
            engine.grammars.submit(params.constraint).result(timeout=120)
    for request_id, (ids, params) in requests.items():
        engine.add_request(request_id, ids, params.clone())
    seen: dict[str, list] = {request_id: [] for request_id in requests}
    aborted = False
    while engine.has_unfinished():
        for out in engine.step():
            seen[out.request_id].append(out)
        if not aborted and len(token_ids(seen["aborted"])) >= abort_after:
            engine.abort("aborted")
            aborted = True
    result = {}
    for request_id, outs in seen.items():
        logprobs = [(lp.token_id, lp.logprob, lp.top) for out in outs for lp in out.new_logprobs]
        text = "".join(out.new_text for out in outs)
        result[request_id] = (token_ids(outs), text, outs[-1].finish_reason, logprobs)
    return result


@pytest.fixture(scope="module")
def stop_text(tiny_qwen2_vl_dir):
    """A piece of the greedy answer's text, so the stop-string request stops mid-way."""
    engine = make_engine(tiny_qwen2_vl_dir, overlap_scheduling=False)
    engine.add_request("probe", list(range(5, 30)), greedy(20))
    text = ""
    while engine.has_unfinished():
        text += "".join(out.new_text for out in engine.step())
    engine.close()
    assert len(text) > 8
    return text[len(text) // 2 : len(text) // 2 + 3]


@pytest.mark.parametrize("num_pages", [256, 24], ids=["roomy", "preempting"])
def test_overlap_gives_the_same_tokens_as_without(tiny_qwen2_vl_dir, stop_text, num_pages):
    results, preemptions = {}, {}
    for overlap in (False, True):
        engine = make_engine(tiny_qwen2_vl_dir, num_pages=num_pages, overlap_scheduling=overlap)
        assert engine.overlap is overlap
        results[overlap] = run(engine, workload(stop_text))
        preemptions[overlap] = engine.stats().preemptions
        engine.close()
    # The abort lands after the step() that shows its 3rd token; with overlap one step()
    # may retire two steps (the one in flight, then a constrained one at once), so it may
    # have shown a 4th: the tokens up to the abort are compared.
    on, off = results[True], results[False]
    assert on.pop("aborted")[0][:3] == off.pop("aborted")[0][:3]
    assert_same(on, off)
    on, off = run_aborting(tiny_qwen2_vl_dir, num_pages)
    assert on == off and off[2] == "abort" and len(off[0]) == 3
    off = results[False]
    assert off["stop-str"][2] == "stop" and off["stop-str"][1].endswith(stop_text) is False
    assert off["greedy"][2] == "length" and len(off["greedy"][0]) == 20
    if num_pages == 24:
        assert preemptions[True] > 0 and preemptions[False] > 0


def assert_same(on: dict, off: dict) -> None:
    """Tokens, text, finish reasons and logprob tokens equal; logprob values equal up to
    float32 rounding. The values may differ in their last bits (5e-7 seen on one CPU): a
    matmul can round differently when the two modes' steps batch different rows."""
    assert on.keys() == off.keys()
    for request_id in off:
        *same_on, logprobs_on = on[request_id]
        *same_off, logprobs_off = off[request_id]
        assert same_on == same_off, request_id
        assert len(logprobs_on) == len(logprobs_off), request_id
        for (token, value, top), (token_off, value_off, top_off) in zip(
            logprobs_on, logprobs_off, strict=True
        ):
            assert token == token_off and [t for t, _ in top] == [t for t, _ in top_off]
            values = [value, *(v for _, v in top)]
            values_off = [value_off, *(v for _, v in top_off)]
            assert values == pytest.approx(values_off, abs=1e-4), request_id


def run_aborting(model_dir, num_pages: int):
    """The aborted request with a free one beside it (no constrained step): each step()
    retires one step, so the abort lands after the same token with overlap or without."""
    results = {}
    for overlap in (False, True):
        engine = make_engine(model_dir, num_pages=num_pages, overlap_scheduling=overlap)
        requests = workload("never")
        requests = {key: requests[key] for key in ("aborted", "seeded")}
        results[overlap] = run(engine, requests)["aborted"]
        engine.close()
    return results[True], results[False]


def test_overlap_is_off_by_default_on_the_cpu(tiny_qwen2_vl_dir):
    engine = make_engine(tiny_qwen2_vl_dir)
    assert engine.config.device == "cpu" and engine.overlap is False
    engine.close()


class TensorReads:
    """Counts reads of tensor values by the host (each one a sync on a GPU) while active,
    the attention planners' included (they size their launches from host-side lengths)."""

    METHODS = ("tolist", "item", "cpu", "numpy", "__bool__", "__int__", "__float__", "__index__")

    def __init__(self, monkeypatch) -> None:
        self.count = 0
        for name in self.METHODS:
            original = getattr(torch.Tensor, name)
            monkeypatch.setattr(torch.Tensor, name, self._counting(original))

    def _counting(self, original):
        def read(tensor, *args, **kwargs):
            self.count += 1
            return original(tensor, *args, **kwargs)

        return read


def test_a_step_waits_for_the_device_once_and_reads_nothing_else(tiny_qwen2_vl_dir, monkeypatch):
    """With overlap on (as on CUDA), each step that retires a step syncs exactly once, and
    no other tensor is read by the host: the path that would sync (reading step k's tokens
    to build step k+1's inputs, penalties or logprobs) is not taken."""
    engine = make_engine(tiny_qwen2_vl_dir, overlap_scheduling=True)
    requests = workload("never")
    del requests["json"]  # a grammar's bitmask is built on the host (its steps do not overlap)
    for request_id, (ids, params) in requests.items():
        engine.add_request(request_id, ids, params.clone())
    reads = TensorReads(monkeypatch)
    steps = 0
    while engine.has_unfinished():
        syncs, before = host_syncs.count, reads.count
        retiring = engine._inflight is not None
        engine.step()
        assert host_syncs.count - syncs == (1 if retiring else 0)
        # The one read: the packed ids (+ logprobs) of the retired step, after its wait.
        assert reads.count - before == host_syncs.count - syncs
        steps += 1
    assert steps > 20
    engine.close()


def test_a_step_with_a_constrained_row_is_retired_at_once(tiny_qwen2_vl_dir):
    engine = make_engine(tiny_qwen2_vl_dir, overlap_scheduling=True)
    constraint = Constraint(ConstraintKind.JSON_OBJECT)
    engine.add_request("free", [5, 6, 7], greedy(30))
    engine.add_request("json", [5, 6, 7], SamplingParams(temperature=0.0, max_tokens=8,
                                                         constraint=constraint))  # fmt: skip
    overlapped = constrained_steps = 0
    while engine.has_unfinished():
        engine.step()
        json_running = "json" in engine.requests and engine.requests["json"].num_output_tokens
        if engine._inflight is not None:
            overlapped += 1
            assert all(seq.grammar is None for seq in engine._inflight.seqs)
        elif json_running:
            constrained_steps += 1
    assert overlapped > 0 and constrained_steps > 0
    engine.close()
