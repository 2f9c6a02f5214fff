"""The encoder pool: Encode goes to the encoders in turn; an unavailable one is skipped."""

from __future__ import annotations

import itertools
import logging
from collections.abc import Sequence

import grpc

from encoder_svc.proto import encoder_pb2, encoder_pb2_grpc
from gateway.clients.channels import open_channel
from iris.mtls import TLSFiles
from iris.telemetry import grpc_metadata

log = logging.getLogger(__name__)


class EncodersUnavailable(Exception):
    """Every encoder refused the call as unavailable (the request becomes a 503)."""


class EncoderPool:
    """Round-robin over encoder addresses; the address list may change (discovery)."""

    def __init__(self, fingerprint: bytes, timeout_s: float, tls: TLSFiles | None = None) -> None:
        self.fingerprint = fingerprint
        self.tls = tls
        self.timeout_s = timeout_s
        self._stubs: dict[str, tuple[grpc.aio.Channel, encoder_pb2_grpc.EncoderStub]] = {}
        self._turn = itertools.count()

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
        items: Sequence[encoder_pb2.EncodeItem],
        identity_salt: bytes | None = None,
        metadata=None,
    ) -> encoder_pb2.EncodeResponse:
        """Encode on one encoder, moving on to the next while they are UNAVAILABLE.
        `identity_salt` is the salt that went into the items' identities (the encoder
        re-computes them)."""
        addresses = self.addresses
        if not addresses:
            raise EncodersUnavailable("no encoder is configured")
        request = encoder_pb2.EncodeRequest(
            items=list(items), fingerprint=self.fingerprint, identity_salt=identity_salt or b""
        )
        start = next(self._turn)
        errors = []
        for step in range(len(addresses)):
            address = addresses[(start + step) % len(addresses)]
            entry = self._stubs.get(address)
            if entry is None:
                continue
            try:
                return await entry[1].Encode(
                    request,
                    timeout=self.timeout_s,
                    metadata=metadata if metadata is not None else grpc_metadata(),
                )
            except grpc.aio.AioRpcError as err:
                if err.code() not in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.UNIMPLEMENTED):
                    raise
                log.warning("encoder %s unavailable: %s", address, err.details())
                errors.append(f"{address}: {err.details()}")
        raise EncodersUnavailable("; ".join(errors))

    async def close(self) -> None:
        for channel, _ in self._stubs.values():
            await channel.close()
        self._stubs.clear()
