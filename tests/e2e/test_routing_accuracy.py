"""Routing accuracy and regret on a real `iris up` platform (two LLM pods, three gateways): a
repeated-image chat is routed with a precise prediction, and a pod whose prefix cache is
dropped behind the gateways' backs (ResetPrefixCache's silent form, a test hook the pods run
with here) shows as over-predictions and as regret by a stale index; all run on the
session's shared `platform_two_pods`, so counters are read as differences. A gateway made to
pick the emptier pod (round-robin, which sees no prefix: the platform's third gateway, used
by no other test) counts the tokens the other pod held as regret. The counters are read
from each gateway's own /metrics page."""

from __future__ import annotations

import grpc
import httpx
import pytest

from iris import metrics as names
from iris.up.metrics_page import metrics_url, scrape
from llm_svc.proto import llm_pb2, llm_pb2_grpc
from tests.e2e.helpers import image_message, image_png
from tests.fixtures.platform import ROUND_ROBIN_GATEWAY

pytestmark = pytest.mark.slow


@pytest.fixture
def two_gateways(platform_two_pods):
    """The session's two-pod, two-gateway platform (tests/fixtures/platform.py)."""
    return platform_two_pods


def counters(platform) -> dict[str, float]:
    """The routing-accuracy counters, summed over every gateway."""
    wanted = (
        names.GATEWAY_ROUTING_PREDICTED,
        names.GATEWAY_ROUTING_PREDICTED_WITHIN_PAGE,
        names.GATEWAY_ROUTING_OVER_PREDICTIONS,
        names.GATEWAY_ROUTING_UNDER_PREDICTIONS,
    )
    totals = dict.fromkeys(wanted, 0.0)
    for gateway in platform.by_kind("gateway"):
        page = scrape(metrics_url(gateway))
        for name in wanted:
            totals[name] += page.get(name, 0.0)
    return totals


def regret(platform, reason: str, gateways=None) -> float:
    """Regret tokens counted under `reason`, summed over `gateways` (every gateway if
    None)."""
    labels = {names.LABEL_REASON: reason}
    return sum(
        scrape(metrics_url(gateway), labels).get(names.GATEWAY_ROUTING_REGRET_TOKENS, 0.0)
        for gateway in (platform.by_kind("gateway") if gateways is None else gateways)
    )


def image_part(seed: int) -> dict:
    return image_message(image_png(seed))[0]["content"][0]


def chat(url: str, model: str, messages: list[dict]) -> tuple[str, str, int]:
    """(answer, serving pod's address, cached prompt tokens)."""
    body = {"model": model, "messages": messages, "max_tokens": 4, "temperature": 0}
    response = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=120)
    assert response.status_code == 200, response.text
    reply = response.json()
    cached = reply["usage"].get("prompt_tokens_details", {}).get("cached_tokens", 0)
    return reply["choices"][0]["message"]["content"], response.headers["x-iris-pod"], cached


def image_chat(platform, seed: int, turns: int, gateway: int = 0) -> list[str]:
    """One conversation about one image, each turn resending the history; the pods served."""
    url = platform.gateway_urls[gateway]
    image = image_part(seed)
    messages = [{"role": "system", "content": "You describe pictures in a few words. " * 8}]
    pods = []
    for turn in range(turns):
        content = [{"type": "text", "text": f"Question {turn}: what do you see?"}]
        if turn == 0:
            content.insert(0, image)
        messages.append({"role": "user", "content": content})
        answer, pod, _ = chat(url, platform.model_name, messages)
        pods.append(pod)
        messages.append({"role": "assistant", "content": answer})
    return pods


def test_a_repeated_image_chat_is_routed_with_precision(two_gateways):
    before = counters(two_gateways)
    # One conversation through each gateway (turns of one conversation through several
    # gateways would race each gateway's KV events against the next turn).
    for gateway, seed in enumerate((11, 12)):
        image_chat(two_gateways, seed, turns=5, gateway=gateway)
    after = counters(two_gateways)
    predicted = after[names.GATEWAY_ROUTING_PREDICTED] - before[names.GATEWAY_ROUTING_PREDICTED]
    within = (
        after[names.GATEWAY_ROUTING_PREDICTED_WITHIN_PAGE]
        - before[names.GATEWAY_ROUTING_PREDICTED_WITHIN_PAGE]
    )
    assert predicted >= 8, after  # every later turn was routed for its history's prefix
    assert within / predicted >= 0.95, after


def test_a_cache_dropped_behind_the_gateways_back_shows_as_over_predictions(two_gateways):
    """Changes shared state: one pod's prefix cache is emptied silently, so the gateways'
    index holds stale entries for it. Other tests' prompts are their own and no test relies
    on another's cached prefix; the last request here stores this prompt again."""
    platform = two_gateways
    url, model = platform.gateway_url, platform.model_name
    image = image_part(21)
    messages = [
        {"role": "system", "content": "You describe pictures in a few words. " * 8},
        {"role": "user", "content": [image, {"type": "text", "text": "What is this?"}]},
    ]
    _, pod, _ = chat(url, model, messages)
    _, again, cached = chat(url, model, messages)  # the same prompt: routed to its prefix
    assert again == pod and cached > 0
    before = counters(platform)
    stale_before = regret(platform, "stale_index")
    with grpc.insecure_channel(pod) as channel:
        stub = llm_pb2_grpc.LLMStub(channel)
        freed = stub.ResetPrefixCache(llm_pb2.ResetPrefixCacheRequest(silent=True)).pages_freed
    assert freed > 0
    _, third, cached = chat(url, model, messages)
    after = counters(platform)
    assert third == pod and cached == 0
    over = names.GATEWAY_ROUTING_OVER_PREDICTIONS
    assert after[over] - before[over] == 1, (before, after)
    assert (
        after[names.GATEWAY_ROUTING_PREDICTED_WITHIN_PAGE]
        == before[names.GATEWAY_ROUTING_PREDICTED_WITHIN_PAGE]
    )
    # Nothing else held the prompt: every token the index promised is regret, by its staleness.
    assert regret(platform, "stale_index") - stale_before > 0


def test_the_emptier_pod_chosen_over_the_holder_counts_regret(platform_two_pods):
    """Through the shared platform's round-robin gateway, which only this test uses: its
    picks alternate between the two pods, and its counters are its own. The prompt (its
    system text too) is this test's own, so neither pod holds any of it beforehand."""
    platform = platform_two_pods
    gateway = platform.by_kind("gateway")[ROUND_ROBIN_GATEWAY]
    url, model = platform.gateway_urls[ROUND_ROBIN_GATEWAY], platform.model_name
    messages = [
        {"role": "system", "content": "You name what a picture shows, and little else. " * 7},
        {"role": "user", "content": [image_part(31), {"type": "text", "text": "What is it?"}]},
    ]
    _, holder, _ = chat(url, model, messages)
    tie_before = regret(platform, "tie", [gateway])
    # Round-robin takes the other pod, which holds nothing of the prompt the holder holds.
    _, emptier, cached = chat(url, model, messages)
    tie_after = regret(platform, "tie", [gateway])
    assert emptier != holder and cached == 0
    assert tie_after - tie_before > 0
    # Back on the holder: what it held is about what the emptier pod was charged for.
    _, again, cached = chat(url, model, messages)
    assert again == holder and cached > 0
    assert regret(platform, "tie", [gateway]) == tie_after
    assert abs((tie_after - tie_before) - cached) <= 16  # within a page (the pods' 16)
