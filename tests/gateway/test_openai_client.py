"""The official `openai` client, unmodified, against a gateway wired to real cache, encoder
and LLM processes (tests/fixtures/platform.py)."""

import base64
import io

import openai
import pytest
from PIL import Image

from iris.metrics import GATEWAY_POD_KV_EVENT_SEQ, LABEL_LLM_POD
from iris.up.metrics_page import scrape
from iris.up.processes import wait_until


def image_url(colour: str, size=(96, 64)) -> str:
    buffer = io.BytesIO()
    Image.new("RGB", size, colour).save(buffer, "PNG")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()


def indexed_seq(platform, address: str) -> float:
    """The pod's last KV event seq that the gateway's prefix index has applied (the metric
    names the pod by its name, never its address)."""
    pod = next(service.name for service in platform.by_kind("llm") if service.address == address)
    page = scrape(platform.metrics_url("gateway"), {LABEL_LLM_POD: pod})
    return page.get(GATEWAY_POD_KV_EVENT_SEQ, -1.0)


def user(text: str, url: str | None = None) -> list[dict]:
    content = [{"type": "text", "text": text}]
    if url:
        content.append({"type": "image_url", "image_url": {"url": url}})
    return [{"role": "user", "content": content}]


def test_chat_text_and_usage(platform):
    client = platform.openai_client()
    reply = client.chat.completions.create(
        model=platform.model_name, messages=user("Hello"), max_tokens=5, temperature=0
    )
    assert isinstance(reply.choices[0].message.content, str)
    assert reply.choices[0].finish_reason in ("stop", "length")
    assert 0 < reply.usage.completion_tokens <= 5
    assert reply.usage.prompt_tokens > 0
    assert reply.usage.prompt_tokens_details.cached_tokens >= 0


def test_chat_with_an_image_counts_its_tokens_and_reuses_the_prefix(platform):
    client = platform.openai_client()
    messages = user("What is in this image?", image_url("red"))
    text_only = client.chat.completions.create(
        model=platform.model_name, messages=user("What is in this image?"), max_tokens=2
    )
    first = client.chat.completions.create(
        model=platform.model_name, messages=messages, max_tokens=2, temperature=0
    )
    from iris.models import load_adapter

    image_tokens, _ = load_adapter(platform.model_dir).image_token_count(96, 64)
    # The image adds its tokens plus <|vision_start|> and <|vision_end|>.
    assert first.usage.prompt_tokens == text_only.usage.prompt_tokens + image_tokens + 2
    second = client.chat.completions.create(
        model=platform.model_name, messages=messages, max_tokens=2, temperature=0
    )
    assert second.usage.prompt_tokens == first.usage.prompt_tokens
    assert second.usage.prompt_tokens_details.cached_tokens > 0
    assert second.choices[0].message.content == first.choices[0].message.content


def test_stream_yields_chunks_and_usage(platform):
    client = platform.openai_client()
    stream = client.chat.completions.create(
        model=platform.model_name,
        messages=user("Count", image_url("blue")),
        max_tokens=4,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert isinstance(text, str)
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens > 0


def test_completions_with_text_and_token_prompts(platform):
    client = platform.openai_client()
    reply = client.completions.create(model=platform.model_name, prompt="The", max_tokens=3)
    assert reply.usage.completion_tokens > 0
    tokens = client.completions.create(model=platform.model_name, prompt=[1, 2, 3], max_tokens=2)
    assert tokens.usage.prompt_tokens == 3


def test_errors_arrive_as_openai_exceptions(platform):
    client = platform.openai_client(max_retries=0)
    with pytest.raises(openai.BadRequestError, match="image"):
        client.chat.completions.create(
            model=platform.model_name,
            messages=user("x", "data:image/png;base64," + base64.b64encode(b"junk").decode()),
            stream=True,
        )
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="other", messages=user("x"))
    with pytest.raises(openai.BadRequestError, match="temperature"):
        client.chat.completions.create(model=platform.model_name, messages=user("x"), temperature=9)
    assert [m.id for m in client.models.list().data] == [platform.model_name]


def test_routing_follows_the_pods_kv_events(platform_two_pods, tiny_qwen2_vl_dir):
    """Warm a prefix on pod B directly; the gateway then sends that prefix to B."""
    import asyncio

    import grpc

    from gateway.dispatch import item_to_proto
    from gateway.intake.prompt import PromptBuilder
    from gateway.intake.remote import RemoteImageFetcher
    from iris.models import load_adapter
    from iris.multimodal import DecodePolicy
    from llm_svc.proto import llm_pb2, llm_pb2_grpc

    adapter = load_adapter(tiny_qwen2_vl_dir)
    builder = PromptBuilder(
        adapter,
        policy=DecodePolicy(),
        fetcher=RemoteImageFetcher(enabled=False, allow_list=[], max_bytes=1, timeout_s=1),
        max_images=4,
    )
    client = platform_two_pods.openai_client()
    for i, target in enumerate(platform_two_pods.llm_addresses):
        # A different prompt per pod, long enough for many full KV blocks.
        text = f"{i} " + ("Describe the picture in detail, part " + str(i) + ". ") * 12
        messages = [{"role": "user", "content": text}]
        prompt = asyncio.run(builder.chat(messages))
        with grpc.insecure_channel(target) as channel:
            stub = llm_pb2_grpc.LLMStub(channel)
            request = llm_pb2.GenerateRequest(
                request_id=f"warm-{target}",
                input_ids=prompt.input_ids.tolist(),
                items=[item_to_proto(item) for item in prompt.items],
                fingerprint=adapter.fingerprint,
            )
            request.sampling.max_tokens = 1
            list(stub.Generate(request))
            seq = stub.GetKVSnapshot(llm_pb2.KVSnapshotRequest()).seq
        # The pod's STORED events (up to `seq`) have reached the gateway's index.
        assert wait_until(lambda t=target, s=seq: indexed_seq(platform_two_pods, t) >= s, 60)
        raw = client.chat.completions.with_raw_response.create(
            model=platform_two_pods.model_name, messages=messages, max_tokens=1
        )
        assert raw.headers["x-iris-pod"] == target
