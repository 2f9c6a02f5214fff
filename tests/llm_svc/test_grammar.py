"""Grammar-constrained decoding in the engine (llm_svc/engine/grammar), on the tiny
Qwen2-VL checkpoint: a random model, so only the grammar keeps its output valid."""

from __future__ import annotations

import json
import os
import time

import jsonschema
import pytest

from llm_svc.engine import InvalidRequestError, SamplingParams
from llm_svc.engine.grammar import Constraint, ConstraintKind
from tests.fixtures.schemas import SCHEMAS
from tests.llm_svc.conftest import make_engine, run_all, token_ids
from tests.llm_svc.stalling_grammar_worker import STALL

PROMPT = list(range(20, 32))


def schema_constraint(schema: dict) -> Constraint:
    return Constraint(ConstraintKind.JSON_SCHEMA, json.dumps(schema))


def params(constraint=None, temperature=0.0, max_tokens=300, **extra) -> SamplingParams:
    # ignore_eos: only the grammar may end a constrained request before max_tokens.
    return SamplingParams(
        temperature=temperature,
        max_tokens=max_tokens,
        ignore_eos=True,
        constraint=constraint,
        **extra,
    )


def text_of(outputs) -> str:
    return "".join(out.new_text for out in outputs)


@pytest.fixture(scope="module")
def engine(tiny_qwen2_vl_dir):
    # A request's wait for its grammar (queue and compile) is bounded; twenty schemas on
    # two slots of a busy test machine must not meet that bound (its own tests below do).
    engine = make_engine(
        tiny_qwen2_vl_dir, max_num_seqs=48, num_pages=2048, grammar_queue_timeout_s=600.0
    )
    yield engine
    engine.close()


def test_twenty_schemas_greedy_and_sampled_all_validate(engine):
    requests = {}
    for name, schema in SCHEMAS.items():
        requests[f"{name}/greedy"] = (PROMPT, params(schema_constraint(schema)))
        sampled = params(schema_constraint(schema), temperature=1.0, top_p=0.95, seed=7)
        requests[f"{name}/sampled"] = (PROMPT, sampled)
    outputs = run_all(engine, requests)
    for request_id, outs in outputs.items():
        schema = SCHEMAS[request_id.split("/")[0]]
        assert outs[-1].finish_reason == "stop", (request_id, text_of(outs))
        jsonschema.validate(json.loads(text_of(outs)), schema)


def test_free_requests_beside_constrained_ones_produce_their_solo_tokens(engine):
    free = {f"free{i}": (PROMPT[i:], params(max_tokens=12)) for i in range(3)}
    free["seeded"] = (PROMPT, params(temperature=0.8, seed=11, max_tokens=12))
    alone = {key: token_ids(outs) for key, outs in run_all(engine, free).items()}
    mixed = dict(free)
    for i, name in enumerate(list(SCHEMAS)[:6]):
        constraint = schema_constraint(SCHEMAS[name])
        mixed[f"constrained{i}"] = (PROMPT, params(constraint, temperature=1.0, seed=i))
    together = run_all(engine, mixed)
    for key in free:
        assert token_ids(together[key]) == alone[key]
    for i, name in enumerate(list(SCHEMAS)[:6]):
        jsonschema.validate(json.loads(text_of(together[f"constrained{i}"])), SCHEMAS[name])


def test_a_grammar_ends_the_request_before_max_tokens_and_eos(engine):
    constraint = Constraint(ConstraintKind.REGEX, "(yes|no)")
    outs = run_all(engine, {"r": (PROMPT, params(constraint, max_tokens=200))})["r"]
    assert outs[-1].finish_reason == "stop"
    assert text_of(outs) in ("yes", "no")
    assert len(token_ids(outs)) < 10


def test_one_schema_compiles_once_for_many_requests(engine):
    schema = {"type": "object", "properties": {"k": {"enum": [1, 2]}}, "required": ["k"]}
    before = engine.grammars.num_compiled
    requests = {
        f"n{i}": (PROMPT, params(schema_constraint(schema), temperature=1.0, seed=i))
        for i in range(3)
    }
    outputs = run_all(engine, requests)
    assert engine.grammars.num_compiled == before + 1
    for outs in outputs.values():
        jsonschema.validate(json.loads(text_of(outs)), schema)


def test_chunked_prefill_and_preemption_keep_the_output_valid_and_unchanged(tiny_qwen2_vl_dir):
    schema = SCHEMAS["ref_definitions"]
    constraint = schema_constraint(schema)
    requests = {
        f"r{i}": (list(range(10, 40)), params(constraint, seed=i, temperature=1.0, max_tokens=100))
        for i in range(4)
    }
    roomy = make_engine(tiny_qwen2_vl_dir, num_pages=512)
    reference = {key: token_ids(outs) for key, outs in run_all(roomy, requests).items()}
    roomy.close()
    # 8-token prefill chunks, and too few pages for all four: sequences are preempted and
    # recomputed while their matchers keep their state.
    tight = make_engine(
        tiny_qwen2_vl_dir, max_num_batched_tokens=8, num_pages=40, enable_prefix_caching=False
    )
    outputs = run_all(tight, requests)
    assert tight.scheduler.num_preemptions > 0
    for key, outs in outputs.items():
        assert token_ids(outs) == reference[key]
        jsonschema.validate(json.loads(text_of(outs)), schema)
    tight.close()


def test_stop_strings_still_end_a_constrained_request(engine):
    schema = SCHEMAS["invoice"]
    constraint = schema_constraint(schema)
    outs = run_all(engine, {"s": (PROMPT, params(constraint, stop=['"paid"']))})["s"]
    assert outs[-1].finish_reason == "stop"
    assert text_of(outs).startswith('{"number": "INV') and '"paid"' not in text_of(outs)


def test_logprobs_never_list_a_token_the_grammar_forbids(engine):
    constraint = Constraint(ConstraintKind.REGEX, "(ab|cd)")
    outs = run_all(engine, {"l": (PROMPT, params(constraint, logprobs=20))})["l"]
    for out in outs:
        for entry in out.new_logprobs:
            assert entry.top and all(value > float("-inf") for _, value in entry.top)


def test_logit_bias_moves_only_its_request(engine):
    solo = token_ids(run_all(engine, {"a": (PROMPT, params(max_tokens=6))})["a"])
    favoured = 77
    outputs = run_all(
        engine,
        {
            "biased": (PROMPT, params(max_tokens=6, logit_bias={favoured: 100.0})),
            "plain": (PROMPT, params(max_tokens=6)),
        },
    )
    assert token_ids(outputs["biased"]) == [favoured] * 6
    assert token_ids(outputs["plain"]) == solo
    banned = params(max_tokens=6, logit_bias={token: -100.0 for token in set(solo)})
    avoided = token_ids(run_all(engine, {"b": (PROMPT, banned)})["b"])
    assert not set(avoided) & set(solo)


@pytest.mark.parametrize(
    ("bias", "needle"),
    [
        ({token: 1.0 for token in range(301)}, "at most 300 entries"),
        ({448: 1.0}, "token ids in [0, 448)"),
        ({5: 100.5}, "logit_bias[5]=100.5"),
        ({5: float("nan")}, "logit_bias[5]=nan"),
    ],
)
def test_bad_logit_bias_is_refused(engine, bias, needle):
    with pytest.raises(InvalidRequestError) as error:
        engine.add_request("bad", PROMPT, params(logit_bias=bias))
    assert needle in str(error.value)


def _nested(depth: int) -> dict:
    schema: dict = {"type": "integer"}
    for _ in range(depth):
        schema = {"type": "object", "properties": {"a": schema}, "required": ["a"]}
    return schema


@pytest.mark.parametrize(
    ("constraint", "needle"),
    [
        (schema_constraint(_nested(20)), "over the limit of 32"),
        (Constraint(ConstraintKind.JSON_SCHEMA, "[" * 5000 + "]" * 5000), "deeper than"),
        (Constraint(ConstraintKind.JSON_SCHEMA, '{"a": ' * 3), "not valid JSON"),
        (Constraint(ConstraintKind.JSON_SCHEMA, "[1]"), "must be a JSON object"),
        (Constraint(ConstraintKind.REGEX, "x" * (70 << 10)), "at most 65536 bytes"),
        (Constraint(ConstraintKind.EBNF, ""), "must not be empty"),
    ],
)
def test_constraints_over_the_limits_are_refused_at_once(engine, constraint, needle):
    with pytest.raises(InvalidRequestError) as error:
        engine.add_request("bad", PROMPT, params(constraint))
    assert needle in str(error.value) and "constraint=" in str(error.value)
    assert "bad" not in engine.requests


@pytest.mark.parametrize(
    "constraint",
    [
        schema_constraint({"type": "object", "properties": {"a": {"$ref": "#/$defs/none"}}}),
        Constraint(ConstraintKind.REGEX, "(unclosed"),
        Constraint(ConstraintKind.EBNF, "root ::= undefined_rule"),
        Constraint(ConstraintKind.STRUCTURAL_TAG, '{"type": "structural_tag", "format": 3}'),
    ],
)
def test_an_uncompilable_constraint_fails_its_request_alone(engine, constraint):
    outputs = run_all(
        engine, {"bad": (PROMPT, params(constraint)), "good": (PROMPT, params(max_tokens=4))}
    )
    bad = outputs["bad"][-1]
    assert bad.finish_reason == "error" and "cannot be compiled" in str(bad.error)
    assert isinstance(bad.error, InvalidRequestError)
    assert len(token_ids(outputs["good"])) == 4


@pytest.fixture(scope="module")
def stalling_engine(tiny_qwen2_vl_dir):
    """One compile worker that never finishes a STALL constraint (a test-only constraint,
    tests/llm_svc/stalling_grammar_worker.py) and is killed 2 s into any compile."""
    engine = make_engine(
        tiny_qwen2_vl_dir,
        grammar_compile_threads=1,
        grammar_compile_timeout_s=2.0,
        grammar_queue_timeout_s=600.0,
        grammar_worker_module="tests.llm_svc.stalling_grammar_worker",
    )
    yield engine
    engine.close()


def run_stepping(engine) -> dict[str, list]:
    outputs = {}
    while engine.has_unfinished():
        for out in engine.step():
            outputs.setdefault(out.request_id, []).append(out)
    return outputs


def test_abort_while_compiling_frees_the_request(stalling_engine):
    engine = stalling_engine
    engine.add_request("c", PROMPT, params(Constraint(ConstraintKind.REGEX, STALL + "abort")))
    assert engine.stats().waiting == 1
    engine.abort("c")
    outs = engine.step()
    assert [out.finish_reason for out in outs] == ["abort"]
    assert not engine.has_unfinished() and len(engine.compiling) == 0


def test_a_compile_past_its_timeout_is_killed_and_the_next_compiles_in_a_fresh_worker(
    stalling_engine,
):
    engine = stalling_engine
    pool = engine.grammars
    killed_before = pool.num_timed_out
    slow = Constraint(ConstraintKind.REGEX, STALL + "a{1,500}")
    engine.add_request("slow", PROMPT, params(slow))
    # Queued behind the stalled compile on the one slot: it runs once that worker is killed.
    engine.add_request("next", PROMPT, params(schema_constraint(SCHEMAS["flat_object"])))
    engine.add_request("free", PROMPT, params(max_tokens=5))
    outputs = run_stepping(engine)
    assert len(token_ids(outputs["free"])) == 5
    failed = outputs["slow"][-1]
    assert failed.finish_reason == "error" and "did not compile within the limit of 2 s" in str(
        failed.error
    )
    assert outputs["next"][-1].finish_reason == "stop"
    jsonschema.validate(json.loads(text_of(outputs["next"])), SCHEMAS["flat_object"])
    killed = list(pool.killed_pids)[killed_before - pool.num_timed_out :]
    assert len(killed) >= 1 and pool.workers[0].pid not in killed
    for pid in killed:  # killed and reaped
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
    # Varying the numbers does not buy another compile; a smaller variant would be tried.
    compiles = pool.num_compiled
    again = pool.submit(Constraint(ConstraintKind.REGEX, STALL + "a{1,900}"))
    assert again.done() and "did not compile within" in str(again.exception())
    assert pool.num_compiled == compiles and pool.num_timed_out == killed_before + len(killed)


@pytest.mark.parametrize(
    "schema",
    [
        {"type": "object", "properties": {"s": {"type": "string", "maxLength": 4}}},
        {"type": "object", "properties": {"s": {"type": "string"}}},
    ],
)
def test_json_strings_refuse_control_bytes_and_encoded_surrogates(engine, schema):
    """xgrammar 0.2.9 lets both into JSON strings; the pool's grammars do not."""
    import xgrammar

    compiled = engine.grammars.submit(schema_constraint(schema)).result()
    for good, bad in (
        (b'{"s": "ab"}', b'{"s": "a\x01"}'),
        ('{"s": "é"}'.encode(), b'{"s": "\xed\xa0\x80"}'),
    ):
        assert xgrammar.GrammarMatcher(compiled).accept_string(good)
        assert not xgrammar.GrammarMatcher(compiled).accept_string(bad)


class Clock:
    """A hand-moved clock for the failure cache's expiry."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_timeouts_are_remembered_by_shape_only_for_larger_numbers_in_the_same_places():
    from llm_svc.engine.grammar.failures import FailureCache

    cache = FailureCache(entries=2, ttl_s=60.0, clock=Clock())
    failed = InvalidRequestError("constraint", "regex", "did not compile within 4 s")
    cache.record(Constraint(ConstraintKind.REGEX, "[a-z]{1,5000}x{2}"), failed, by_shape=True)
    assert cache.lookup(Constraint(ConstraintKind.REGEX, "[a-z]{1,7000}x{3}")) is failed
    assert cache.lookup(Constraint(ConstraintKind.REGEX, "[a-z]{1,20}x{2}")) is None  # tried
    # A larger number elsewhere does not make it larger where the failed one was large.
    assert cache.lookup(Constraint(ConstraintKind.REGEX, "[a-z]{1,20}x{9000}")) is None
    assert cache.lookup(Constraint(ConstraintKind.EBNF, "[a-z]{1,7000}x{3}")) is None
    assert cache.lookup(Constraint(ConstraintKind.REGEX, "[a-y]{1,7000}x{3}")) is None


def test_plain_errors_are_remembered_by_exact_text_only():
    from llm_svc.engine.grammar.failures import FailureCache

    cache = FailureCache(entries=8, ttl_s=60.0, clock=Clock())
    for bad, good in (
        ('{"minimum": 10, "maximum": 1}', '{"minimum": 1, "maximum": 10}'),
        ("[9-0]{3}-[9-0]{4}", "[0-9]{3}-[0-9]{4}"),
    ):
        failed = InvalidRequestError("constraint", "regex", "cannot be compiled")
        cache.record(Constraint(ConstraintKind.REGEX, bad), failed, by_shape=False)
        assert cache.lookup(Constraint(ConstraintKind.REGEX, bad)) is failed
        assert cache.lookup(Constraint(ConstraintKind.REGEX, good)) is None


def test_failures_expire():
    from llm_svc.engine.grammar.failures import FailureCache

    clock = Clock()
    cache = FailureCache(entries=8, ttl_s=60.0, clock=clock)
    slow, bad = (Constraint(ConstraintKind.REGEX, text) for text in ("a{1,900}", "(x"))
    failed = InvalidRequestError("constraint", "regex", "did not compile")
    cache.record(slow, failed, by_shape=True)
    cache.record(bad, failed, by_shape=False)
    clock.now = 59.0
    assert cache.lookup(slow) is failed and cache.lookup(bad) is failed
    clock.now = 61.0
    assert cache.lookup(slow) is None and cache.lookup(bad) is None


def test_another_tenants_bad_schema_does_not_refuse_a_valid_one(engine):
    """Through the real pool and xgrammar: min > max is refused, its mirror compiles."""
    bad = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 10, "maximum": 1}}}
    good = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 1, "maximum": 10}}}
    failed = engine.grammars.submit(schema_constraint(bad))
    assert "cannot be compiled" in str(failed.exception(timeout=60))
    regex_bad = engine.grammars.submit(Constraint(ConstraintKind.REGEX, "[9-0]{3}-[9-0]{4}"))
    assert "cannot be compiled" in str(regex_bad.exception(timeout=60))
    outputs = run_all(
        engine,
        {
            "json": (PROMPT, params(schema_constraint(good), max_tokens=60)),
            "regex": (PROMPT, params(Constraint(ConstraintKind.REGEX, "[0-9]{3}-[0-9]{4}"))),
        },
    )
    assert outputs["json"][-1].finish_reason == "stop", outputs["json"][-1]
    assert 1 <= json.loads(text_of(outputs["json"])).get("n", 1) <= 10
    assert outputs["regex"][-1].finish_reason == "stop", outputs["regex"][-1]


@pytest.fixture(scope="module")
def deadline_engine(tiny_qwen2_vl_dir):
    """One compile worker (the stalling one), a generous compile limit, and a 3 s limit on
    a request's whole wait for its grammar, queue and compile together."""
    engine = make_engine(
        tiny_qwen2_vl_dir,
        grammar_compile_threads=1,
        grammar_compile_timeout_s=30.0,
        grammar_queue_timeout_s=3.0,
        grammar_worker_module="tests.llm_svc.stalling_grammar_worker",
    )
    engine.grammars.wait_ready(60)
    yield engine
    engine.close()


def test_one_deadline_covers_queue_and_compile_and_dead_jobs_never_take_a_slot(
    deadline_engine,
):
    """ "stall" takes the one slot; "queued" waits behind it and passes its deadline in the
    queue; "stall again" (the same constraint as "stall", sent last) keeps the stalled
    compile wanted until after that. So the slot frees only when "queued" has nobody
    waiting for it, whatever the machine's speed: that job is dropped, never compiled."""
    engine = deadline_engine
    pool = engine.grammars
    killed, dropped = pool.num_timed_out, pool.num_dropped
    stall = Constraint(ConstraintKind.REGEX, STALL + "deadline")
    queued = Constraint(ConstraintKind.REGEX, "q[a-z]{1,7}")
    stalled = engine.add_request("stall", PROMPT, params(stall)).grammar.future
    engine.add_request("queued", PROMPT, params(queued))
    engine.add_request("stall again", PROMPT, params(stall))
    outputs = run_stepping(engine)
    # The pool kills the compile at the last request's deadline (not at its 30 s limit).
    assert "(waiting and compiling;" in str(stalled.exception(timeout=25))
    for name in ("stall", "stall again"):
        error = str(outputs[name][-1].error)
        assert "was not compiled within the limit of 3 s (waiting and compiling;" in error
    error = str(outputs["queued"][-1].error)
    assert "found no free compile slot within the limit of 3 s" in error
    assert pool.num_timed_out == killed + 1 and pool.num_dropped == dropped + 1
    # A compile cut short by its requests' deadline says nothing of the constraint.
    assert pool.failures.lookup(stall) is None
    # The slot is free again for a legitimate constraint; the dropped one compiles now.
    outputs = run_all(
        engine,
        {
            "next": (PROMPT, params(schema_constraint(SCHEMAS["flat_object"]))),
            "queued": (PROMPT, params(queued)),
        },
    )
    assert outputs["next"][-1].finish_reason == "stop"
    assert outputs["queued"][-1].finish_reason == "stop"


def test_a_request_that_joins_a_running_compile_waits_its_own_limit(deadline_engine):
    """ "first" starts a compile that never ends (the stalling worker) and may wait a few
    seconds; "joined" asks for the same constraint once that compile runs, and may wait twice
    as long. The compile keeps the later deadline: it is cut short only once "joined" has
    waited its whole limit (a slow machine can only delay that), never at the first one's.
    The slot threads run at idle priority, so on a starved machine the first request's limit
    may pass before its compile starts (the job is then dropped unstarted): that attempt
    proves nothing, and the next one gives the slot twice the time. The limits stay under
    the fixture's 30 s compile limit."""
    pool = deadline_engine.grammars
    for attempt, first_s in enumerate((3.0, 6.0, 12.0)):
        stall = Constraint(ConstraintKind.REGEX, STALL + f"joined{attempt}")
        future = pool.submit(stall, wait_s=first_s)
        while not future.done() and not future.running():
            time.sleep(0.01)
        if future.running():
            break
    assert future.running(), "the slot never took the compile, even with 12 s to do so"
    joined_at, joined_s = time.monotonic(), 2 * first_s
    assert pool.submit(stall, wait_s=joined_s) is future
    error = future.exception(timeout=120)
    assert time.monotonic() >= joined_at + joined_s, "cut short at the first request's deadline"
    limit = f"was not compiled within the limit of {joined_s:g} s (waiting and compiling;"
    assert limit in str(error), str(error)


def test_a_grammar_that_ends_before_min_tokens_ends_the_request_with_stop(engine):
    """Once the grammar allows only its end, min_tokens's hold on the end gives way: the
    grammar's end wins (finish_reason "stop"), never a row with no token left."""
    constraint = Constraint(ConstraintKind.REGEX, "(yes|no)")
    short = SamplingParams(temperature=0.0, max_tokens=40, min_tokens=20, constraint=constraint)
    outputs = run_all(engine, {"short": (PROMPT, short), "free": (PROMPT, params(max_tokens=3))})
    last = outputs["short"][-1]
    assert last.finish_reason == "stop" and last.error is None, last
    assert text_of(outputs["short"]) in ("yes", "no")
    assert len(token_ids(outputs["free"])) == 3
