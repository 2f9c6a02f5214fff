"""One rule for the cached prefix (issue 34, item 4; issue 45, item 5): the gateway counts as
covered exactly the blocks the pod will take from its prefix cache, so an image on a
prompt's last page is reserved and encoded, never left to an "embedding missing". Both sides
run their own code: the gateway's router over its KV index, the pod's block manager over a
radix cache, each asking iris.multimodal.PrefixResumeRule, the gateway's built from the
layers the pod reports in GetModelInfo."""

from __future__ import annotations

import numpy as np

from gateway.dispatch import Dispatcher
from gateway.routing.config import load_router_config
from gateway.routing.kv_index import KVIndex
from gateway.routing.plugins.base import RoutingRequest
from gateway.routing.pods import Pod, PodLoad
from gateway.routing.router import Router
from gateway.routing.watcher import attention_layers
from iris.multimodal import PrefixResumeRule, block_hashes, layers_from_windows
from llm_svc.engine import SamplingParams
from llm_svc.engine.block_manager import BlockManager
from llm_svc.engine.radix_cache import RadixCache
from llm_svc.engine.sequence import Sequence
from llm_svc.proto import llm_pb2
from llm_svc.server.server import reported_layers

PAGE = 4
FINGERPRINT = bytes(range(32))


def _pod_reuses(ids: list[int], rule: PrefixResumeRule | None = None, ran: int | None = None):
    """Tokens the pod takes from its prefix cache for `ids`, after it ran `ids[:ran]` (all
    of `ids` by default) once."""
    blocks = BlockManager(16, PAGE, RadixCache(PAGE, FINGERPRINT), rule)
    earlier = Sequence("earlier", ids[:ran], SamplingParams())
    blocks.append(earlier, earlier.num_tokens)
    earlier.num_computed_tokens = earlier.num_tokens
    blocks.commit(earlier)  # every full page of what it ran is cached now
    blocks.release(earlier)
    again = Sequence("again", ids, SamplingParams())
    return blocks.match_prefix(again)


def test_pod_and_gateway_agree_through_the_reported_model_info():
    """The pod's rule (sliding and full layers) travels as GetModelInfo's layers (the wire
    message, serialized and parsed); the gateway's rule built from them covers exactly what
    the pod resumes, for every prompt length and every prefix the pod ran before."""
    pod_rule = PrefixResumeRule(PAGE, layers_from_windows([8, None, 8]))
    wire = llm_pb2.ModelInfo(page_size=PAGE, layers=reported_layers(pod_rule))
    info = llm_pb2.ModelInfo.FromString(wire.SerializeToString())
    pod = Pod("pod", page_size=info.page_size, layers=attention_layers(info), healthy=True)
    assert pod.resume_rule == pod_rule
    for length in range(0, 30, 3):
        ids = list(range(1000, 1000 + length))
        for ran in range(0, length + 1, 5):
            index = KVIndex()  # the snapshot a pod that ran ids[:ran] gives
            index.load_snapshot("pod", 0, block_hashes(FINGERPRINT, np.array(ids[:ran]), PAGE))
            router = Router(load_router_config("prefix-aware"), index)
            request = RoutingRequest(np.array(ids, dtype=np.int64), FINGERPRINT)
            decision = router.route(request, [pod])
            assert decision.matched_tokens == _pod_reuses(ids, pod_rule, ran), (length, ran)


def test_an_image_on_the_last_page_is_reserved_when_the_pod_holds_every_page():
    ids = list(range(1000, 1016))  # 16 tokens: four full pages
    image_offsets = [(12, 15)]  # the image fills the last page (inclusive span)
    index = KVIndex()
    index.load_snapshot("pod", 0, block_hashes(FINGERPRINT, np.array(ids), PAGE))
    router = Router(load_router_config("prefix-aware"), index)
    pod = Pod("pod", page_size=PAGE, healthy=True, load=PodLoad())
    decision = router.route(RoutingRequest(np.array(ids), FINGERPRINT), [pod])
    # The gateway and the pod agree: three pages, not four.
    assert decision.matched_tokens == _pod_reuses(ids) == 12

    class Prompt:  # what _uncovered reads of a PreparedPrompt
        items = [type("Item", (), {"offsets": image_offsets})()]

    assert Dispatcher._uncovered(Prompt, decision.matched_tokens) == [0]
