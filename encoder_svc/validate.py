"""Checks on an Encode request before any work is admitted; each failure names the value
and the limit (the servicer answers INVALID_ARGUMENT or FAILED_PRECONDITION)."""

from __future__ import annotations

from dataclasses import dataclass

from encoder_svc.jobs import EncodeJob
from encoder_svc.proto import encoder_pb2
from iris.multimodal import SALT_BYTES, hash_of_identity, image_identity, video_group_identity
from iris.proto import common_pb2

FINGERPRINT_BYTES = 32
IDENTITY_BYTES = 32
IMAGE_MODALITIES = (common_pb2.MODALITY_UNSPECIFIED, common_pb2.IMAGE)
# A VIDEO item is one frame group: its `image` holds the packed frames
# (iris.multimodal.video.pack_group), identified by video_group_identity.
MODALITIES = (*IMAGE_MODALITIES, common_pb2.VIDEO)


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
    """The request's items as jobs, in order; raises InvalidRequest / WrongModel.

    Every item's identity is re-computed from the bytes to be encoded (with the request's
    salt): an item whose identity is not its image's is refused, so no caller — not even a
    compromised gateway — can store one image's embedding under another's key."""
    check_fingerprint(request.fingerprint, expected_fingerprint)
    if len(request.items) > limits.max_items:
        raise InvalidRequest(
            f"request has {len(request.items)} items, over the limit of {limits.max_items}"
        )
    salt = bytes(request.identity_salt)
    if salt and len(salt) != SALT_BYTES:
        raise InvalidRequest(f"identity_salt is {len(salt)} bytes, expected 0 or {SALT_BYTES}")
    return [
        _job(index, entry, limits, expected_fingerprint, salt)
        for index, entry in enumerate(request.items)
    ]


def _job(
    index: int,
    entry: encoder_pb2.EncodeItem,
    limits: RequestLimits,
    fingerprint: bytes,
    salt: bytes,
) -> EncodeJob:
    item = entry.item
    where = f"items[{index}]"
    if item.modality not in MODALITIES:
        name = common_pb2.Modality.Name(item.modality)
        raise InvalidRequest(f"{where}: modality {name} is not supported (IMAGE, VIDEO)")
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
    image = bytes(entry.image)
    video = item.modality == common_pb2.VIDEO
    key = _key(where, item, image, fingerprint, salt, video)
    return EncodeJob(key, item.token_count, tuple(item.grid), image, video=video)


def _key(
    where: str,
    item: common_pb2.MultimodalItem,
    image: bytes,
    fingerprint: bytes,
    salt: bytes,
    video: bool = False,
) -> bytes:
    """The item's identity, once it is checked to be the image's own."""
    if len(item.identity) != IDENTITY_BYTES:
        raise InvalidRequest(
            f"{where}: identity is {len(item.identity)} bytes, expected {IDENTITY_BYTES} "
            "(the encoder keys only by identities it can re-compute from the bytes)"
        )
    if item.hash and item.hash != hash_of_identity(item.identity):
        raise InvalidRequest(
            f"{where}: hash {item.hash:016x} is not the identity's first 8 bytes "
            f"{item.identity[:8].hex()}"
        )
    identity = video_group_identity if video else image_identity
    computed = identity(image, fingerprint, salt or None)
    if computed != item.identity:
        raise InvalidRequest(
            f"{where}: identity {item.identity[:8].hex()}... is not the identity of the image "
            f"bytes sent ({computed[:8].hex()}...) under this salt"
        )
    return bytes(item.identity)
