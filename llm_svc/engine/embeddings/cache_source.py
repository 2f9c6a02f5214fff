"""Embeddings from the embedding cache service (docs/design/engine.md)."""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping

import torch

from embedding_cache_svc.client import CacheClient, CacheError, Failed, Status
from iris.mtls import TLSFiles
from iris.multimodal import MultimodalItem
from llm_svc.engine.embeddings.base import EmbeddingSource
from llm_svc.engine.errors import CacheUnavailableError, EmbeddingMissingError, ImageFailedError

log = logging.getLogger(__name__)


class CacheEmbeddingSource(EmbeddingSource):
    """`get_many(hold=True)`; what is not there yet is waited for (PENDING / RESERVED: an
    encoder is on it) until `wait_s` after the fetch began.

    failed(reason) → ImageFailedError(reason); FREE (nobody encodes it) or still pending at
    the deadline → EmbeddingMissingError; the cache unreachable within the client's timeout
    → CacheUnavailableError. Rows, hidden size and dtype are checked by the client (a
    mismatch is a miss) and the checksum after transfer.
    """

    def __init__(self, client: CacheClient, wait_s: float) -> None:
        if wait_s <= 0:
            raise ValueError(f"wait_s must be > 0, got {wait_s}")
        self.client = client
        self.wait_s = wait_s

    @classmethod
    def connect(
        cls,
        address: str,
        fingerprint: bytes,
        *,
        wait_s: float,
        timeout_s: float,
        tls: TLSFiles | None = None,
    ) -> CacheEmbeddingSource:
        """A source with its own client of the cache at `address` (host:port), over
        mutual TLS when `tls` is enabled."""
        return cls(CacheClient(address, fingerprint, timeout_s=timeout_s, tls=tls), wait_s)

    def fetch(
        self, items: Mapping[int, MultimodalItem], hidden: int, dtype: torch.dtype
    ) -> dict[int, torch.Tensor]:
        deadline = time.monotonic() + self.wait_s
        found: dict[int, torch.Tensor] = {}
        pending = dict(items)
        try:
            while True:
                requests = self._requests(pending)
                results = self._call(self.client.get_many, requests, hidden, dtype, hold=True)
                self._take(results, pending, found)
                if not pending:
                    return found
                left = deadline - time.monotonic()
                if left <= 0:
                    raise self._missing(pending, f"still pending after {self.wait_s:g} s")
                states = self._call(self.client.wait, self._requests(pending), left)
                self._check_states(states, pending)
        except BaseException:
            self.release([items[index] for index in found])
            raise

    def release(self, items: list[MultimodalItem]) -> None:
        if items:
            self.client.release([item.key for item in items])

    def report_corrupt(self, item: MultimodalItem, reason: str) -> None:
        """ReportCorrupt (Delete is admin-only): the cache checks the entry and drops it."""
        try:
            reply = self.client.report_corrupt(item.key, reason)
        except CacheError as err:  # the entry's TTL still ends it; the request fails anyway
            log.warning("could not report entry %s as corrupt: %s", item.key.hex(), err)
            return
        log.warning(
            "reported entry %s as corrupt (%s): cache found %s, dropped=%s",
            item.key.hex(),
            reason,
            reply.finding,
            reply.dropped,
        )

    def close(self) -> None:
        self.client.close()

    # --- helpers -----------------------------------------------------------------------
    @staticmethod
    def _requests(pending: Mapping[int, MultimodalItem]) -> list[tuple[bytes, int]]:
        return [(item.key, item.token_count) for item in pending.values()]

    @staticmethod
    def _call(method, *args, **kwargs):
        try:
            return method(*args, **kwargs)
        except CacheError as err:
            raise CacheUnavailableError(f"embedding cache: {err}") from err

    @staticmethod
    def _take(results: dict, pending: dict[int, MultimodalItem], found: dict) -> None:
        for index, item in list(pending.items()):
            value = results.get(item.key)
            if isinstance(value, Failed):
                raise ImageFailedError(value.reason, index)
            if value is not None:
                found[index] = value
                del pending[index]

    def _check_states(self, states: dict, pending: dict[int, MultimodalItem]) -> None:
        for index, item in pending.items():
            state = states.get(item.key)
            if isinstance(state, Failed):
                raise ImageFailedError(state.reason, index)
            if state == Status.FREE:
                raise self._missing({index: item}, "not in the cache and nobody is encoding it")

    @staticmethod
    def _missing(pending: Mapping[int, MultimodalItem], why: str) -> EmbeddingMissingError:
        index, item = next(iter(pending.items()))
        return EmbeddingMissingError(f"items[{index}] (key {item.key.hex()}) {why}", index)
