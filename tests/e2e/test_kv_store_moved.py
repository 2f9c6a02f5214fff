"""The KV store the LLM pods share, end to end (`iris up --llm-pods 2 --kv-store redis`,
issue 67), on a tiny plain Qwen3: a conversation whose pod is stopped between turns
continues on the other pod, which loads the first turn's pages from the store
(cached_tokens covers them) and answers as a cold prefill would (greedy); and under per-key
tenancy another key's request for the same prompt loads nothing from the store (the tenant
salt is in every key)."""

from __future__ import annotations

import openai
import pytest

from iris.up.metrics_page import metrics_url, scrape
from iris.up.processes import wait_until
from tests.fixtures.platform import POD_HEADER, start_platform

pytestmark = pytest.mark.slow
KEYS = ("key-alice", "key-bob", "key-carol")  # per-key tenancy: a salt each
PAGE_SIZE = 16  # the pods' default IRIS_LLM_PAGE_SIZE
WRITTEN = "iris_llm_kv_store_bytes_total"
HITS = "iris_llm_kv_store_hits_total"
# Long enough for several full pages, short enough for a quick prefill on the CPU.
SYSTEM = " ".join(
    f"Rule {i}: answer in plain words, cite the manual, keep it short." for i in range(12)
)


@pytest.fixture(scope="module")
def kv_platform(tmp_path_factory):
    """Two LLM pods of a tiny plain Qwen3 (no encoder to start) over one Redis KV store,
    three API keys (per-key tenancy), X-Iris-Pod on."""
    from iris.models.text_tiny import build

    root = tmp_path_factory.mktemp("kv-store")
    build("qwen3", root / "model")
    running = start_platform(
        root / "model",
        root / "logs",
        llm_pods=2,
        kv_store="redis",
        api_keys=KEYS,
        extra_env={"gateway": POD_HEADER},
    )
    yield running
    running.stop()


def ask(platform, key: str, messages: list[dict]) -> tuple[str, str, int, int]:
    """(answer, the serving pod's address, prompt tokens, cached tokens), greedy."""
    client = openai.OpenAI(base_url=f"{platform.gateway_url}/v1", api_key=key, timeout=60)
    raw = client.chat.completions.with_raw_response.create(
        model=platform.model_name, messages=messages, max_tokens=6, temperature=0
    )
    reply = raw.parse()
    details = reply.usage.prompt_tokens_details
    cached = details.cached_tokens if details is not None else 0
    return (
        reply.choices[0].message.content,
        raw.headers["x-iris-pod"],
        reply.usage.prompt_tokens,
        cached,
    )


def pod(platform, address: str):
    return next(service for service in platform.by_kind("llm") if service.address == address)


def written(service) -> float:
    return scrape(metrics_url(service), {"direction": "written"}).get(WRITTEN, 0.0)


def wait_written(service, before: float) -> None:
    """Until the pod's writer has put its new pages in the store: the written bytes grew
    and held still over two polls (the writer drains its queue in batches)."""
    seen = [before]

    def settled() -> bool:
        now = written(service)
        done = now > before and now == seen[-1]
        seen.append(now)
        return done

    assert wait_until(settled, 15, 0.3), f"no pages written to the store: {seen[-3:]}"


def store_hits(platform) -> float:
    return sum(
        scrape(metrics_url(service)).get(HITS, 0.0)
        for service in platform.by_kind("llm")
        if not service.exited()
    )


def test_another_key_loads_nothing_from_the_store(kv_platform):
    messages = [
        {"role": "system", "content": SYSTEM + " Tenancy."},
        {"role": "user", "content": "Which rule comes first?"},
    ]
    before = {s.name: written(s) for s in kv_platform.by_kind("llm")}
    _, address, prompt_tokens, _ = ask(kv_platform, KEYS[0], messages)
    first = pod(kv_platform, address)
    wait_written(first, before[first.name])
    hits = store_hits(kv_platform)
    answer, _, same_tokens, cached = ask(kv_platform, KEYS[1], messages)
    assert same_tokens == prompt_tokens >= 4 * PAGE_SIZE
    assert cached == 0, "another key's request reused the first key's pages"
    assert store_hits(kv_platform) == hits  # nothing loaded from the store either
    assert answer is not None


def test_a_conversation_moved_to_another_pod_loads_its_history_from_the_store(kv_platform):
    messages = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": "What do the rules say?"},
    ]
    before = {s.name: written(s) for s in kv_platform.by_kind("llm")}
    answer, address, first_prompt, _ = ask(kv_platform, KEYS[0], messages)
    first = pod(kv_platform, address)
    wait_written(first, before[first.name])
    first.child.stop()  # the pod that held the conversation is gone
    messages += [
        {"role": "assistant", "content": answer},
        {"role": "user", "content": "And the last one?"},
    ]
    moved, other, prompt_tokens, cached = ask(kv_platform, KEYS[0], messages)
    assert other != address
    # Every full page of the first turn came from the store (the other pod never saw it).
    assert first_prompt // PAGE_SIZE * PAGE_SIZE <= cached < prompt_tokens
    assert scrape(metrics_url(pod(kv_platform, other))).get(HITS, 0.0) > 0
    # A key of its own prefills it all (no salt shares a page): the same greedy answer.
    cold, _, _, cold_cached = ask(kv_platform, KEYS[2], messages)
    assert cold_cached == 0
    assert moved == cold
