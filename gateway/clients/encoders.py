"""The encoder pool: Encode goes to the encoders in turn; an unavailable or full one is
skipped for the next."""

from __future__ import annotations

import itertools
import logging
import math
import time
from collections.abc import Sequence

import grpc

from encoder_svc.proto import encoder_pb2, encoder_pb2_grpc
from gateway.clients.channels import open_channel
from iris.mtls import TLSFiles
from iris.rates import Rate
from iris.telemetry import grpc_metadata

log = logging.getLogger(__name__)


# The encoder's retry hint on RESOURCE_EXHAUSTED (encoder_svc/service.py RETRY_AFTER_KEY).
RETRY_AFTER_KEY = "retry-after-ms"
_SKIPPED = (
    grpc.StatusCode.UNAVAILABLE,
    grpc.StatusCode.UNIMPLEMENTED,
    grpc.StatusCode.RESOURCE_EXHAUSTED,
)


class EncodersUnavailable(Exception):
    """Every encoder refused the call as unavailable (the request becomes a 503)."""


class EncodersFull(EncodersUnavailable):
    """No encoder could take the call and at least one said it was full: the request
    becomes a 429 whose Retry-After is `retry_after_s`, the soonest an encoder expects room
    (whole seconds, rounded up)."""

    def __init__(self, message: str, retry_after_s: int) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


def retry_after_hint_ms(err: grpc.aio.AioRpcError) -> int | None:
    """The `retry-after-ms` trailing metadata of a refusal, if it carries a number."""
    for key, value in err.trailing_metadata() or ():
        if key == RETRY_AFTER_KEY:
            try:
                return max(0, int(value))
            except (TypeError, ValueError):
                return None
    return None


class EncoderPool:
    """Round-robin over encoder addresses; the address list may change (discovery)."""

    def __init__(self, fingerprint: bytes, timeout_s: float, tls: TLSFiles | None = None) -> None:
        self.fingerprint = fingerprint
        self.tls = tls
        self.timeout_s = timeout_s
        self._stubs: dict[str, tuple[grpc.aio.Channel, encoder_pb2_grpc.EncoderStub]] = {}
        self._turn = itertools.count()
        # Image tokens per second of this gateway's Encode calls (queueing at the encoder
        # included): the vision share of routing's time estimate (estimated-ttft).
        self.rate = Rate()

    @property
    def addresses(self) -> list[str]:
        return sorted(self._stubs)

    async def set_addresses(self, addresses: Sequence[str]) -> None:
        """Open channels to new encoders, close those that left."""
        wanted = set(addresses)
        for address in set(self._stubs) - wanted:
            channel, _ = self._stubs.pop(address)
            await channel.close()
        for address in wanted - set(self._stubs):
            channel = open_channel(address, self.tls, "encoder")
            self._stubs[address] = (channel, encoder_pb2_grpc.EncoderStub(channel))

    async def encode(
        self,
        items: Sequence[encoder_pb2.EncodeItem] | encoder_pb2.EncodeRequest,
        identity_salt: bytes | None = None,
        metadata=None,
    ) -> encoder_pb2.EncodeResponse:
        """Encode on one encoder, moving on to the next while they are UNAVAILABLE or full
        (RESOURCE_EXHAUSTED). EncodersFull when none took it and one was full,
        EncodersUnavailable when all were unavailable. `identity_salt` is the salt that
        went into the items' identities (the encoder re-computes them). `items` may be a
        whole EncodeRequest already built (off the loop: a video's groups are megabytes)."""
        addresses = self.addresses
        if not addresses:
            raise EncodersUnavailable("no encoder is configured")
        if isinstance(items, encoder_pb2.EncodeRequest):
            request = items
        else:
            request = encoder_pb2.EncodeRequest(
                items=list(items), fingerprint=self.fingerprint, identity_salt=identity_salt or b""
            )
        start = next(self._turn)
        errors, hints, full = [], [], False
        for step in range(len(addresses)):
            address = addresses[(start + step) % len(addresses)]
            entry = self._stubs.get(address)
            if entry is None:
                continue
            started = time.perf_counter()
            try:
                response = await entry[1].Encode(
                    request,
                    timeout=self.timeout_s,
                    metadata=metadata if metadata is not None else grpc_metadata(),
                )
            except grpc.aio.AioRpcError as err:
                if err.code() not in _SKIPPED:
                    raise
                if err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED:
                    full = True
                    hint = retry_after_hint_ms(err)
                    if hint is not None:
                        hints.append(hint)
                log.warning("encoder %s refused: %s", address, err.details())
                errors.append(f"{address}: {err.details()}")
                continue
            tokens = sum(item.item.token_count for item in request.items)
            self.rate.observe(tokens, time.perf_counter() - started)
            return response
        if full:
            retry_after_s = max(1, math.ceil(min(hints) / 1000)) if hints else 1
            raise EncodersFull("; ".join(errors), retry_after_s)
        raise EncodersUnavailable("; ".join(errors))

    async def close(self) -> None:
        for channel, _ in self._stubs.values():
            await channel.close()
        self._stubs.clear()
