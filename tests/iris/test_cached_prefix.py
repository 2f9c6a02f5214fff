"""One rule for the cached prefix (issue 34, item 4): the gateway counts as covered exactly
the blocks the pod will take from its prefix cache, so an image on a prompt's last page is
reserved and encoded, never left to an "embedding missing". Both sides run their own code:
the gateway's router over its KV index, the pod's block manager over a radix cache."""

from __future__ import annotations

import numpy as np

from gateway.dispatch import Dispatcher
from gateway.routing.config import load_router_config
from gateway.routing.kv_index import KVIndex
from gateway.routing.plugins.base import RoutingRequest
from gateway.routing.pods import Pod, PodLoad
from gateway.routing.router import Router
from iris.multimodal import block_hashes, reusable_blocks
from llm_svc.engine import SamplingParams
from llm_svc.engine.block_manager import BlockManager
from llm_svc.engine.radix_cache import RadixCache
from llm_svc.engine.sequence import Sequence

PAGE = 4
FINGERPRINT = bytes(range(32))


def test_reusable_blocks_leave_the_last_token_to_compute():
    assert [reusable_blocks(n, PAGE) for n in (0, 1, 4, 5, 8, 9)] == [0, 0, 0, 1, 1, 2]


def _pod_reuses(ids: list[int]) -> int:
    """Tokens the pod takes from its prefix cache for `ids`, after it ran `ids` once."""
    blocks = BlockManager(16, PAGE, RadixCache(PAGE, FINGERPRINT))
    earlier = Sequence("earlier", ids, SamplingParams())
    blocks.append(earlier, len(ids))
    earlier.num_computed_tokens = len(ids)
    blocks.commit(earlier)  # every full page of the prompt is cached now
    blocks.release(earlier)
    again = Sequence("again", ids, SamplingParams())
    return blocks.match_prefix(again)


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
