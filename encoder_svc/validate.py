"""Checks on an Encode request before any work is admitted; each failure names the value
and the limit (the servicer answers INVALID_ARGUMENT or FAILED_PRECONDITION)."""

from __future__ import annotations

from dataclasses import dataclass

from encoder_svc.jobs import EncodeJob
from encoder_svc.proto import encoder_pb2
from iris.multimodal import hash_of_identity
from iris.proto import common_pb2

FINGERPRINT_BYTES = 32
IDENTITY_BYTES = 32
IMAGE_MODALITIES = (common_pb2.MODALITY_UNSPECIFIED, common_pb2.IMAGE)


class InvalidRequest(ValueError):
    """The request is malformed or over a limit (INVALID_ARGUMENT)."""


class WrongModel(ValueError):
    """The request's fingerprint is not this encoder's model (FAILED_PRECONDITION)."""


@dataclass(frozen=True)
class RequestLimits:
    max_items: int
    max_item_tokens: int
    max_image_bytes: int


def check_fingerprint(fingerprint: bytes, expected: bytes) -> None:
    if len(fingerprint) != FINGERPRINT_BYTES:
        raise InvalidRequest(
            f"fingerprint is {len(fingerprint)} bytes, expected {FINGERPRINT_BYTES}"
        )
    if fingerprint != expected:
        raise WrongModel(
            f"fingerprint {fingerprint.hex()[:16]}... is not this encoder's model "
            f"({expected.hex()[:16]}...)"
        )


def jobs_from_request(
    request: encoder_pb2.EncodeRequest, expected_fingerprint: bytes, limits: RequestLimits
) -> list[EncodeJob]:
    """The request's items as jobs, in order; raises InvalidRequest / WrongModel."""
    check_fingerprint(request.fingerprint, expected_fingerprint)
    if len(request.items) > limits.max_items:
        raise InvalidRequest(
            f"request has {len(request.items)} items, over the limit of {limits.max_items}"
        )
    return [_job(index, entry, limits) for index, entry in enumerate(request.items)]


def _job(index: int, entry: encoder_pb2.EncodeItem, limits: RequestLimits) -> EncodeJob:
    item = entry.item
    where = f"items[{index}]"
    if item.modality not in IMAGE_MODALITIES:
        name = common_pb2.Modality.Name(item.modality)
        raise InvalidRequest(f"{where}: modality {name} is not supported (IMAGE only)")
    if not entry.image:
        raise InvalidRequest(f"{where}: image is empty")
    if len(entry.image) > limits.max_image_bytes:
        raise InvalidRequest(
            f"{where}: image is {len(entry.image)} bytes, over the limit of "
            f"{limits.max_image_bytes}"
        )
    if item.token_count == 0:
        raise InvalidRequest(f"{where}: token_count must be > 0")
    if item.token_count > limits.max_item_tokens:
        raise InvalidRequest(
            f"{where}: token_count {item.token_count} is over the limit of {limits.max_item_tokens}"
        )
    return EncodeJob(_key(where, item), item.token_count, tuple(item.grid), bytes(entry.image))


def _key(where: str, item: common_pb2.MultimodalItem) -> bytes:
    if item.identity:
        if len(item.identity) != IDENTITY_BYTES:
            raise InvalidRequest(
                f"{where}: identity is {len(item.identity)} bytes, expected {IDENTITY_BYTES}"
            )
        if item.hash and item.hash != hash_of_identity(item.identity):
            raise InvalidRequest(
                f"{where}: hash {item.hash:016x} is not the identity's first 8 bytes "
                f"{item.identity[:8].hex()}"
            )
        return bytes(item.identity)
    if not item.hash:
        raise InvalidRequest(f"{where}: item has neither identity nor hash")
    return item.hash.to_bytes(8, "big")
