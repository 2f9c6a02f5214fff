"""Pages per layer kind (docs/design/engine.md): a model's sliding layers
keep their KV in a pool of their own and give back what leaves the window, during prefill
and decode; a prefix hit needs the window before it; the capacity figure shows the saving.
Tiny Gemma 3 text checkpoints built by transformers."""

from __future__ import annotations

import json
import shutil

import pytest

from iris.models.build import build_atomically
from llm_svc.engine import SamplingParams
from tests.llm_svc.checkpoints import CACHE_ROOT
from tests.llm_svc.conftest import make_engine, run_all, token_ids
from tests.llm_svc.family_checkpoints import WINDOW, family_checkpoint

# 5 sliding layers per full one, as Gemma 3.
PATTERN = ["sliding_attention"] * 5 + ["full_attention"]
LONG_WINDOW = 64  # tokens, with page_size 1: 64 pages


def _gemma3(window: int, layer_types: list[str], name: str):
    from iris.models.text_tiny import build

    keys = dict(num_hidden_layers=len(layer_types), sliding_window=window, layer_types=layer_types)
    return build_atomically(
        CACHE_ROOT / f"gemma3_text-{name}-w1", lambda out: build("gemma3_text", out, **keys)
    )


@pytest.fixture(scope="module")
def pattern_dir():
    return _gemma3(LONG_WINDOW, PATTERN, f"5to1-{LONG_WINDOW}")


def _greedy(max_tokens: int) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)


def test_a_decoding_sequence_holds_at_most_window_plus_chunk_sliding_pages(pattern_dir):
    chunk = 6  # <= 0.1 x the window
    engine = make_engine(pattern_dir, page_size=1, max_num_batched_tokens=chunk, num_pages=512,
                         enable_prefix_caching=False, dtype="float32", device="cpu")  # fmt: skip
    windows = engine.blocks.windows
    assert windows is not None and windows.window == LONG_WINDOW
    prompt = [(7 * i) % 50 + 3 for i in range(3 * LONG_WINDOW)]
    seq = engine.add_request("long", prompt, _greedy(LONG_WINDOW))
    full_most = 0
    while engine.has_unfinished():
        engine.step()
        if seq.is_finished:
            break
        full_most = max(full_most, len(seq.block_table))
        # Nothing else runs: the pool's pages in use are this sequence's. Between steps
        # it holds the window of its next query; `peak_held` counts at each chunk's start.
        expected = min(seq.num_computed_tokens, LONG_WINDOW - 1)
        assert windows.num_used == windows.held(seq) == expected
        assert windows.peak_held <= LONG_WINDOW + chunk, seq.num_computed_tokens
    # The bound is reached (W - 1 keys and a chunk), not met vacuously, while the full
    # layers hold every position.
    assert windows.peak_held == LONG_WINDOW - 1 + chunk
    assert full_most > 3 * LONG_WINDOW
    assert windows.num_used == 0 and len(windows.free_pages) == windows.num_pages - 1


def _cached_tokens(outputs) -> int:
    return outputs[0].num_cached_tokens


def _gateway_blocks(engine, log, prompt: list[int]) -> int:
    """The blocks the gateway predicts the pod resumes for `prompt`: the pod's KV events
    through its log and the wire, replayed into a KV index, asked with the pod's rule."""
    import numpy as np

    from gateway.routing.kv_index import KVIndex
    from gateway.routing.plugins.base import RoutingRequest
    from gateway.routing.pods import Pod
    from gateway.routing.watcher import event_records
    from llm_svc.proto import llm_pb2
    from llm_svc.server.service import _kv_event

    log.publish(engine.take_kv_events())
    index = KVIndex()
    index.load_snapshot("pod", 0, [])
    batch = llm_pb2.KVEventBatch(events=[_kv_event(record) for record in log.since(0)])
    assert index.apply("pod", event_records(batch))
    pod = Pod("pod", page_size=engine.config.page_size, layers=engine.resume_rule.layers)
    request = RoutingRequest(np.asarray(prompt, dtype=np.int64), engine.fingerprint)
    return request.matched_blocks(pod, index)[0]


def test_prefix_hits_after_window_pages_left_stay_exact_at_the_rule_s_depth():
    model_dir = family_checkpoint("gemma3_text")  # window 8, layers sliding, sliding, full
    page = 4
    # A budget that holds few sequences: the window pool (what the split gives it) is
    # small, so a second long prompt evicts the first one's oldest window pages.
    engine = make_engine(model_dir, page_size=page, max_num_batched_tokens=8, num_pages=None,
                         kv_cache_bytes=130_000, max_model_len=64, dtype="float32",
                         device="cpu")  # fmt: skip
    plain = make_engine(model_dir, page_size=page, max_num_batched_tokens=8,
                        enable_prefix_caching=False, dtype="float32", device="cpu")  # fmt: skip
    from llm_svc.server.kv_events import KVEventLog

    log = KVEventLog(capacity=10_000)
    blocks, cache = engine.blocks, engine.blocks.cache
    assert blocks.windows.num_pages < engine.runner.num_pages
    first = [(5 * i) % 40 + 3 for i in range(48)]
    other = [(11 * i) % 40 + 4 for i in range(48)]
    run_all(engine, {"a": (first, _greedy(4))})
    run_all(engine, {"b": (other, _greedy(4))})
    # Every page of both prompts is still cached for the full layer...
    held = cache.match(first)
    assert len(held) == 12
    # ...but the sliding layers' pages of the first prompt's start were evicted.
    gone = [i for i, node in enumerate(held) if node.window_page is None]
    assert gone == list(range(len(gone))) and 0 < len(gone) <= 10  # oldest first

    rule = engine.resume_rule
    cases = {
        # The whole first prompt and more: its last window is held, full hit.
        "inside": first + [9, 9, 9, 9, 9],
        # A point in the evicted part: the hit is cut back to a whole window.
        "gone": first[: 4 * (gone[-1] + 1)] + [8, 8, 8, 8, 8],
    }
    for name, prompt in cases.items():
        chain = cache.match(prompt[: (len(prompt) - 1) // page * page])
        windows = [node.window_page is not None for node in chain]
        predicted = rule.resumable_blocks(
            len(prompt), held_blocks=len(chain), windows=windows.__getitem__
        )
        if name == "inside":
            assert predicted == len(chain) == 12
        else:
            assert 0 <= predicted < len(chain)
            # The deepest point whose trailing window blocks are all held.
            first_block = max(0, predicted * page - WINDOW + 1) // page
            assert all(windows[first_block:predicted])
        # The gateway, from the pod's events (WINDOW_REMOVED among them), predicts the same.
        assert _gateway_blocks(engine, log, prompt) == predicted, name
        got = run_all(engine, {name: (prompt, _greedy(6))})[name]
        want = run_all(plain, {name: (prompt, _greedy(6))})[name]
        assert _cached_tokens(got) == predicted * page, name
        assert token_ids(got) == token_ids(want), name
    engine.close()
    plain.close()


def _full_attention_copy(model_dir, out):
    """The same weights with every layer full attention."""
    shutil.copytree(model_dir, out)
    config = json.loads((out / "config.json").read_text())
    config["layer_types"] = ["full_attention"] * len(config["layer_types"])
    (out / "config.json").write_text(json.dumps(config))
    return out


def test_the_capacity_figure_of_a_sliding_model_grows_by_the_arithmetic_s_ratio(
    pattern_dir, tmp_path
):
    budget, page, max_len, step = 16 << 20, 4, 1024, 64
    common = dict(page_size=page, max_num_batched_tokens=step, num_pages=None,
                  kv_cache_bytes=budget, max_model_len=max_len, dtype="float32",
                  device="cpu")  # fmt: skip
    sliding = make_engine(pattern_dir, **common)
    full = make_engine(_full_attention_copy(pattern_dir, tmp_path / "full"), **common)
    per_layer = full.runner.kv_bytes_per_page() // 6  # one layer's share of a page
    seq_pages = max_len // page  # 256
    window_pages = (LONG_WINDOW - 1) // page + 2  # 17: W - 1 keys + the new token's page
    extra = 1 + step // page  # the null page and one step's chunk
    full_seqs = budget // (6 * per_layer) // seq_pages
    sliding_seqs = (budget - 5 * per_layer * extra) // (
        per_layer * seq_pages + 5 * per_layer * window_pages
    )
    assert full.stats().sequence_capacity == full_seqs == 10
    assert sliding.stats().sequence_capacity == sliding_seqs == 47
    # 6 x 256 / (256 + 5 x 17) = 4.5, before rounding to whole sequences.
    assert sliding_seqs / full_seqs == pytest.approx(6 * seq_pages / (seq_pages + 5 * 17), 0.05)
    sliding.close()
    full.close()


def test_triton_reads_the_window_pool_with_freed_pages_as_sdpa_does(monkeypatch):
    import iris_kernels

    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert iris_kernels.interpreting()
    model_dir = family_checkpoint("gemma3_text")
    prompts = [[(3 * i + n) % 40 + 3 for i in range(n)] for n in (5, 29, 41)]
    results = {}
    for backend in ("triton", "sdpa"):
        engine = make_engine(model_dir, page_size=4, max_num_batched_tokens=7, num_pages=64,
                             attention_backend=backend, dtype="float32", device="cpu")  # fmt: skip
        assert engine.runner.backend.sliding.name == backend
        requests = {f"r{i}": (ids, _greedy(6)) for i, ids in enumerate(prompts)}
        results[backend] = {rid: token_ids(out) for rid, out in run_all(engine, requests).items()}
        assert engine.blocks.windows.peak_held < 41 // 4  # pages were freed on the way
        engine.close()
    assert results["triton"] == results["sdpa"]
