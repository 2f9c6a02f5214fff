"""Generate over real gRPC: the stream's shape, parity with the offline engine (alone and
under concurrency, with chunked prefill), prefix-cache hits, logprobs and stop strings."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from iris.multimodal import block_hashes
from llm_svc import LLM, SamplingParams
from tests.llm_svc.server.pods import IDLE, idle_engine_state, request

# Lengths around and past the 64-token step budget, so prefill runs in chunks.
PROMPTS = [
    [(7 * i + 3 * k) % 300 + 20 for i in range(length)]
    for k, length in enumerate([5, 17, 40, 70, 90, 130])
]
MAX_TOKENS = 10
MIN_GAP = 1e-4  # top-1 vs top-2 logprob: below this, float noise may pick either


@pytest.fixture(scope="module")
def offline(tiny_idefics3_dir):
    """The offline engine with the pod's engine settings, and its greedy references."""
    llm = LLM(
        tiny_idefics3_dir, page_size=4, num_pages=128, max_num_seqs=8,
        max_num_batched_tokens=64, device="cpu",
    )  # fmt: skip
    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True, logprobs=2)
    outputs = llm.generate(prompt_token_ids=PROMPTS, sampling_params=params, use_tqdm=False)
    for out in outputs:
        gaps = [entry.top[0][1] - entry.top[1][1] for entry in out.logprobs]
        # Precondition: no near-tie, so batching cannot legitimately change the choice.
        assert min(gaps) > MIN_GAP, f"near-tie in the reference of {out.request_id}: {gaps}"
    return outputs


async def collect(stub, message):
    """(every response, token ids, text) of one Generate call."""
    responses = [response async for response in stub.Generate(message)]
    ids = [t for r in responses if r.HasField("tokens") for t in r.tokens.token_ids]
    text = "".join(r.tokens.text for r in responses if r.HasField("tokens"))
    return responses, ids, text


async def test_stream_is_accepted_then_tokens_then_finished(stub, offline):
    responses, ids, text = await collect(stub, request("shape-0", PROMPTS[2], MAX_TOKENS))
    kinds = [response.WhichOneof("kind") for response in responses]
    assert kinds[0] == "accepted" and kinds[-1] == "finished"
    assert set(kinds[1:-1]) == {"tokens"}
    assert responses[0].accepted.prompt_tokens == len(PROMPTS[2])
    assert responses[0].accepted.image_tokens == 0
    finished = responses[-1].finished
    assert finished.finish_reason == "length"
    assert finished.usage.prompt_tokens == len(PROMPTS[2])
    assert finished.usage.completion_tokens == MAX_TOKENS == len(ids)
    assert ids == offline[2].token_ids
    assert text == offline[2].text


async def test_concurrent_streams_equal_the_offline_engine(stub, pod, offline):
    calls = [
        collect(stub, request(f"concurrent-{i}", prompt, MAX_TOKENS))
        for i, prompt in enumerate(PROMPTS)
    ]
    results = await asyncio.gather(*calls)
    for (responses, ids, text), reference in zip(results, offline, strict=True):
        assert ids == reference.token_ids
        assert text == reference.text
        assert responses[-1].finished.usage.completion_tokens == MAX_TOKENS
    assert pod.on_engine(idle_engine_state) == IDLE


async def test_a_repeated_prompt_is_served_from_the_prefix_cache(stub):
    prompt = [(11 * i) % 250 + 30 for i in range(33)]
    first, ids_first, _ = await collect(stub, request("prefix-a", prompt, 4))
    second, ids_second, _ = await collect(stub, request("prefix-b", prompt, 4))
    # Full pages of the prompt, leaving at least one token to compute: 32 of 33 tokens.
    assert second[0].accepted.cached_tokens == 32
    assert second[-1].finished.usage.cached_tokens == 32
    assert ids_first == ids_second


async def test_each_cache_salt_is_a_prefix_namespace_of_its_own(stub, pod):
    """Same prompt, other salt: no cached token; same salt: the prefix is reused. The pages
    carry the salted chain (what the gateway's per-salt index computes)."""
    prompt = [(13 * i) % 250 + 31 for i in range(33)]
    tenant_a, tenant_b = bytes(range(32)), bytes(range(2, 34))
    shared, _, _ = await collect(stub, request("salt-shared", prompt, 2))
    first_a, _, _ = await collect(stub, request("salt-a1", prompt, 2, cache_salt=tenant_a))
    first_b, _, _ = await collect(stub, request("salt-b1", prompt, 2, cache_salt=tenant_b))
    again_a, _, _ = await collect(stub, request("salt-a2", prompt, 2, cache_salt=tenant_a))
    assert [m[0].accepted.cached_tokens for m in (shared, first_a, first_b, again_a)] == [
        0, 0, 0, 32,
    ]  # fmt: skip
    cached = pod.on_engine(lambda engine: engine.blocks.cache.block_hashes())
    fingerprint = pod.engine.fingerprint
    for salt in (None, tenant_a, tenant_b):
        assert set(block_hashes(fingerprint, prompt, 4, salt)) <= cached


async def test_a_cache_salt_of_the_wrong_size_is_invalid(stub):
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await collect(stub, request("salt-bad", [40, 41, 42], 2, cache_salt=b"short"))
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "cache_salt has 5 bytes: must be 0 or 32" in refused.value.details()


async def test_logprobs_come_with_each_token(stub, offline):
    message = request("logprobs-0", PROMPTS[1], MAX_TOKENS, logprobs=True, top_logprobs=2)
    responses, ids, _ = await collect(stub, message)
    entries = [e for r in responses if r.HasField("tokens") for e in r.tokens.logprobs]
    assert [entry.token_id for entry in entries] == ids
    for entry, reference in zip(entries, offline[1].logprobs, strict=True):
        assert entry.logprob == pytest.approx(reference.logprob, abs=1e-4)
        assert [top.token_id for top in entry.top] == [token for token, _ in reference.top]
        assert entry.top[0].token_id == entry.token_id  # greedy: the sampled one is top-1
    assert all(entry.token == "" or isinstance(entry.token, str) for entry in entries)


async def test_a_stop_string_ends_the_stream_and_is_trimmed(stub, offline):
    reference = offline[4].text
    stop = next(
        reference[i : i + 2] for i in range(3, len(reference) - 2) if reference[i : i + 2].strip()
    )
    message = request("stop-0", PROMPTS[4], MAX_TOKENS)
    message.sampling.stop.append(stop)
    responses, _, text = await collect(stub, message)
    assert responses[-1].finished.finish_reason == "stop"
    assert text == reference[: reference.find(stop)]
