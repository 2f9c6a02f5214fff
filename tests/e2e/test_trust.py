"""Trust boundaries end to end (issue 20) on the real multi-process platform: identity is
never taken on a client's word, tenants with different salts share nothing, and clients
are not told internal addresses."""

from __future__ import annotations

import uuid

import grpc
import httpx
import pytest
import torch

from embedding_cache_svc.client import CacheClient
from encoder_svc.proto import encoder_pb2, encoder_pb2_grpc
from gateway.tenancy import Tenancy, tenant_salt
from iris.models import load_adapter
from iris.multimodal import image_identity, read_image_header
from iris.proto import common_pb2
from iris.up.metrics_page import metrics_url, scrape
from tests.e2e.helpers import image_message, image_png

IGNORED = "iris_gateway_mm_hashes_ignored_total"
SHARED = Tenancy.SHARED
ENCODED = "iris_encoder_images_total"


@pytest.fixture(scope="module")
def adapter(platform):
    return load_adapter(platform.model_dir)


def chat(platform, messages, **extra) -> httpx.Response:
    body = {
        "model": platform.model_name,
        "messages": messages,
        "max_tokens": 3,
        "temperature": 0,
        **extra,
    }
    return httpx.post(f"{platform.gateway_url}/v1/chat/completions", json=body, timeout=120)


def answer(response: httpx.Response) -> tuple[str, list[list[float]]]:
    """The reply's text and, per token, its top log-probabilities."""
    assert response.status_code == 200, response.text
    choice = response.json()["choices"][0]
    tops = [
        [top["logprob"] for top in entry["top_logprobs"]] for entry in choice["logprobs"]["content"]
    ]
    return choice["message"]["content"], tops


def same_answer(a, b) -> bool:
    # Equal text; log-probabilities equal up to float noise (a prefix-cache hit computes
    # the same prompt in other chunks).
    return a[0] == b[0] and all(
        abs(x - y) < 1e-3
        for xs, ys in zip(a[1], b[1], strict=True)
        for x, y in zip(xs, ys, strict=True)
    )


def gateway_counter(platform, name: str) -> float:
    return scrape(platform.metrics_url("gateway")).get(name, 0.0)


def encoded_images(platform) -> float:
    return sum(scrape(metrics_url(s)).get(ENCODED, 0.0) for s in platform.by_kind("encoder"))


def stored_embedding(platform, adapter, key: bytes, png: bytes):
    header = read_image_header(png)
    token_count, _ = adapter.image_token_count(header.width, header.height)
    hidden = int(adapter.text_config["hidden_size"])
    with CacheClient(platform.cache_address, adapter.fingerprint) as cache:
        return cache.get_many([(key, token_count)], hidden, torch.float32)[key]


def test_an_image_sent_under_another_images_identity_poisons_nothing(platform, adapter):
    """The attack: X is sent claiming Y's identity before anyone has sent Y. Afterwards the
    victim's answer for Y is the clean answer for Y, and Y's cache entry is Y's."""
    victim_png, attacker_png = image_png(seed=4001), image_png(seed=4002)  # same size
    y_identity = image_identity(victim_png, adapter.fingerprint)
    x_identity = image_identity(attacker_png, adapter.fingerprint)
    logprobs = {"logprobs": True, "top_logprobs": 3}
    ignored = gateway_counter(platform, IGNORED)

    attack = answer(
        chat(platform, image_message(attacker_png), mm_hashes=[y_identity.hex()], **logprobs)
    )
    assert gateway_counter(platform, IGNORED) == ignored + 1
    victim = answer(chat(platform, image_message(victim_png), **logprobs))
    # The clean answer: Y encoded afresh from its bytes, in a namespace of its own.
    salt = uuid.uuid4().hex
    clean = answer(chat(platform, image_message(victim_png), cache_salt=salt, **logprobs))
    assert not same_answer(attack, clean), "X and Y must differ for the test to mean anything"
    assert same_answer(victim, clean), (victim, clean)

    # Y's entry holds Y's embedding (equal to the one the salted request stored from Y's
    # bytes), and X's embedding is under X's own identity.
    y_entry = stored_embedding(platform, adapter, y_identity, victim_png)
    salted = image_identity(victim_png, adapter.fingerprint, tenant_salt(SHARED, salt, None))
    clean_entry = stored_embedding(platform, adapter, salted, victim_png)
    x_entry = stored_embedding(platform, adapter, x_identity, attacker_png)
    assert all(isinstance(e, torch.Tensor) for e in (y_entry, clean_entry, x_entry))
    torch.testing.assert_close(y_entry, clean_entry, atol=1e-5, rtol=1e-4)
    assert not torch.allclose(y_entry, x_entry, atol=1e-3)


def test_a_broken_image_under_another_images_identity_fails_only_itself(platform, adapter):
    """The attack's variant: a truncated X claiming Y's identity fails alone; it leaves no
    failed entry under Y's key (which would turn every later request for Y into a 400)."""
    victim_png, attacker_png = image_png(seed=4031), image_png(seed=4032)
    truncated = attacker_png[: len(attacker_png) // 2]
    claimed = image_identity(victim_png, adapter.fingerprint).hex()
    attack = chat(platform, image_message(truncated), mm_hashes=[claimed])
    assert attack.status_code == 400, attack.text
    victim = chat(platform, image_message(victim_png))
    assert victim.status_code == 200, victim.text


def test_the_encoder_refuses_an_identity_that_is_not_the_images(platform, adapter):
    victim_png, attacker_png = image_png(seed=4011), image_png(seed=4012)
    header = read_image_header(attacker_png)
    token_count, grid = adapter.image_token_count(header.width, header.height)
    forged = common_pb2.MultimodalItem(
        modality=common_pb2.IMAGE,
        identity=image_identity(victim_png, adapter.fingerprint),
        token_count=token_count,
        grid=list(grid),
    )
    request = encoder_pb2.EncodeRequest(
        items=[encoder_pb2.EncodeItem(image=attacker_png, item=forged)],
        fingerprint=adapter.fingerprint,
    )
    address = platform.addresses("encoder")[0]
    with grpc.insecure_channel(address) as channel, pytest.raises(grpc.RpcError) as refused:
        encoder_pb2_grpc.EncoderStub(channel).Encode(request, timeout=30)
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "is not the identity of the image bytes sent" in refused.value.details()
    assert stored_embedding(platform, adapter, forged.identity, victim_png) is None


def test_tenants_share_neither_embeddings_nor_prefixes(platform):
    """Same image, same prompt: tenant B gets no hit from tenant A's request (no embedding
    reuse, no cached tokens); A's second request hits both. No X-Iris-Pod header either."""
    run = uuid.uuid4().hex
    messages = image_message(image_png(seed=4021), f"Tenant check {run}: describe it.")
    tenant_a, tenant_b = f"a-{run}", f"b-{run}"

    before = encoded_images(platform)
    first_a = chat(platform, messages, cache_salt=tenant_a)
    assert first_a.status_code == 200, first_a.text
    assert "x-iris-pod" not in first_a.headers
    assert encoded_images(platform) == before + 1
    first_b = chat(platform, messages, cache_salt=tenant_b)
    assert first_b.status_code == 200, first_b.text
    assert encoded_images(platform) == before + 2  # B's image is B's own
    assert first_b.json()["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    again_a = chat(platform, messages, cache_salt=tenant_a)
    assert again_a.status_code == 200, again_a.text
    assert encoded_images(platform) == before + 2
    usage = again_a.json()["usage"]
    assert usage["prompt_tokens_details"]["cached_tokens"] > usage["prompt_tokens"] // 2


def test_under_iris_up_with_two_keys_no_key_reads_the_others_cache(platform):
    """A gateway that takes the keys A and B (`iris up --api-key A --api-key B` sets it so;
    the shared platform's third gateway): B's request gets no cached tokens of A's
    identical prompt (per-key tenancy, the default when keys are required); A's second
    request does."""
    import openai

    from tests.fixtures.platform import GATEWAY_KEYS, KEYED_GATEWAY

    url = platform.gateway_urls[KEYED_GATEWAY]
    clients = {key: openai.OpenAI(base_url=f"{url}/v1", api_key=key) for key in GATEWAY_KEYS}
    messages = image_message(image_png(seed=4041), "Tenant check: describe it.")

    def usage(key: str):
        reply = clients[key].chat.completions.create(
            model=platform.model_name, messages=messages, max_tokens=3, temperature=0
        )
        return reply.usage

    assert usage("key-a").prompt_tokens_details.cached_tokens == 0
    assert usage("key-b").prompt_tokens_details.cached_tokens == 0
    assert usage("key-a").prompt_tokens_details.cached_tokens > 0  # its own prefix
