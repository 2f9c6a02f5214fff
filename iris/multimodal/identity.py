"""Processor fingerprint, image identity and callers' `mm_hashes` (docs/design/multimodal.md)."""

from __future__ import annotations

import hashlib
import json
import logging
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import blake3

from iris.multimodal.weights import weights_identity

IDENTITY_TAG = b"iris-image-v1"
VIDEO_GROUP_TAG = b"iris-video-group-v1"
FINGERPRINT_BYTES = 32
SALT_BYTES = 32  # a salt is a BLAKE3 key
_PARALLEL_HASH_BYTES = 1 << 20
log = logging.getLogger(__name__)


def canonical_json(value: Any) -> bytes:
    """Keys sorted, no spaces, UTF-8: the byte form every fingerprint is computed over."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def fingerprint_document(config: dict, preprocessor: dict | None, weights: str) -> dict:
    """The document the fingerprint hashes, from config.json, preprocessor_config.json and
    the weights' identity (`weights.weights_identity`): two fine-tunes of one base share
    every config, so only the weights tell their embeddings and KV apart."""
    text_config = config.get("text_config") or {}
    hidden = text_config.get("hidden_size", config.get("hidden_size"))
    image_token_id = config.get("image_token_id", config.get("image_token_index"))
    document = {
        "architectures": config.get("architectures"),
        "text_config_hidden_size": hidden,
        "vision_config": config.get("vision_config"),
        "image_token_id": image_token_id,
        "preprocessor": preprocessor,
        "weights": weights,
    }
    # A checkpoint's quantization changes its embeddings and KV as its weights do, so an FP8
    # and a bf16 variant of one model never share keys (absent when unquantized).
    quantization = config.get("quantization_config") or text_config.get("quantization_config")
    if quantization:
        document["quantization_config"] = quantization
    return document


def read_preprocessor_config(model_dir: Path) -> dict | None:
    """The image processor's settings: preprocessor_config.json, or (transformers 5 saves
    some processors this way) the "image_processor" entry of processor_config.json."""
    preprocessor_path = model_dir / "preprocessor_config.json"
    if preprocessor_path.is_file():
        return json.loads(preprocessor_path.read_text())
    processor_path = model_dir / "processor_config.json"
    if processor_path.is_file():
        return json.loads(processor_path.read_text()).get("image_processor")
    return None


def processor_fingerprint(model_dir: str | Path, revision: str = "") -> bytes:
    """SHA-256 of the canonical fingerprint document of a local HF model directory.

    `revision` names the weights (the `model_revision` setting every service reads; the
    chart's `model.revision`); when empty, a BLAKE3 digest of the weight files stands for
    them (computed once per directory, iris/multimodal/weights.py)."""
    model_dir = Path(model_dir)
    config_path = model_dir / "config.json"
    if not config_path.is_file():
        raise FileNotFoundError(f"no config.json in model directory {model_dir}")
    config = json.loads(config_path.read_text())
    preprocessor = read_preprocessor_config(model_dir)
    weights = weights_identity(model_dir, revision)
    document = fingerprint_document(config, preprocessor, weights)
    return hashlib.sha256(canonical_json(document)).digest()


def image_identity(
    image_bytes: bytes | memoryview, fingerprint: bytes, salt: bytes | None = None
) -> bytes:
    """BLAKE3(b"iris-image-v1" ‖ fingerprint ‖ image bytes): 32 bytes.

    With a `salt` (32 bytes: a tenant's, or a no-reuse request's) the same input is hashed
    in BLAKE3's keyed mode with the salt as key, so an identity under one salt says nothing
    about the identity under another, nor under none (the modes are domain-separated).
    """
    if len(fingerprint) != FINGERPRINT_BYTES:
        raise ValueError(f"fingerprint must be {FINGERPRINT_BYTES} bytes, got {len(fingerprint)}")
    check_salt(salt)
    # Large images hash on several threads; the digest does not depend on it.
    threads = blake3.blake3.AUTO if len(image_bytes) >= _PARALLEL_HASH_BYTES else 1
    if salt:
        hasher = blake3.blake3(IDENTITY_TAG, key=salt, max_threads=threads)
    else:
        hasher = blake3.blake3(IDENTITY_TAG, max_threads=threads)
    hasher.update(fingerprint)
    hasher.update(image_bytes)
    return hasher.digest()


def video_group_identity(
    payload: bytes | memoryview | Sequence, fingerprint: bytes, salt: bytes | None = None
) -> bytes:
    """BLAKE3(b"iris-video-group-v1" ‖ fingerprint ‖ frame group bytes): 32 bytes, keyed by
    `salt` as `image_identity` is. The payload is the group after sampling and resizing
    (`iris.multimodal.video.pack_group`: its size, then its RGB pixels), so the same frames
    at the same size are one item whichever clip, request or tenant-free caller sent them.
    It may come as a sequence of buffers hashed in turn (the header, then each frame where
    it lies), which is the same identity without packing them into one copy."""
    if len(fingerprint) != FINGERPRINT_BYTES:
        raise ValueError(f"fingerprint must be {FINGERPRINT_BYTES} bytes, got {len(fingerprint)}")
    check_salt(salt)
    parts = payload if isinstance(payload, (list, tuple)) else [payload]
    size = sum(memoryview(part).nbytes for part in parts)
    threads = blake3.blake3.AUTO if size >= _PARALLEL_HASH_BYTES else 1
    if salt:
        hasher = blake3.blake3(VIDEO_GROUP_TAG, key=salt, max_threads=threads)
    else:
        hasher = blake3.blake3(VIDEO_GROUP_TAG, max_threads=threads)
    hasher.update(fingerprint)
    for part in parts:
        hasher.update(part)
    return hasher.digest()


def check_salt(salt: bytes | None) -> None:
    """A salt is absent (None or empty) or exactly SALT_BYTES bytes; else ValueError."""
    if salt and len(salt) != SALT_BYTES:
        raise ValueError(f"salt must be {SALT_BYTES} bytes, got {len(salt)}")


class MMHashesTypeError(TypeError):
    """`mm_hashes` is not a list of strings (the gateway answers 400)."""


_HEX = re.compile(r"[0-9a-fA-F]+")
_SHOWN_CHARS = 80  # of a caller's entry, in the one log line about it


def parse_mm_hash(entry: str) -> bytes | int | None:
    """16 hex digits → a 64-bit hash (int); 64 → a full identity (bytes); else None."""
    if not isinstance(entry, str) or not _HEX.fullmatch(entry):
        return None
    if len(entry) == 16:
        return int(entry, 16)
    if len(entry) == 64:
        return bytes.fromhex(entry)
    return None


def check_mm_hashes_type(mm_hashes: Any) -> None:
    """`mm_hashes` is None or a list of strings; else MMHashesTypeError (a 400)."""
    if mm_hashes is None:
        return
    if not isinstance(mm_hashes, Sequence) or isinstance(mm_hashes, (str, bytes)):
        raise MMHashesTypeError(
            f"mm_hashes must be a list of hex strings, got {type(mm_hashes).__name__}"
        )
    if not all(isinstance(entry, str) for entry in mm_hashes):
        raise MMHashesTypeError("mm_hashes must be a list of hex strings")


def disagreeing_mm_hashes(mm_hashes: Any, identities: Sequence[bytes]) -> list[int]:
    """Indices of the caller's `mm_hashes` entries that are not the computed identity.

    Identity is never taken on a caller's word (docs/design/multimodal.md): the field is kept for
    SGLang clients, and an entry agrees when it is the image's identity (64 hex digits) or
    its 64-bit hash (16). Every other entry — another image's identity, a malformed string,
    one of a list whose length is not the number of images — is reported here so the
    gateway can count it; nothing the caller sent is ever used as a key. One warning line
    per request names the first such entry, cut to a bounded length.
    """
    check_mm_hashes_type(mm_hashes)
    if mm_hashes is None:
        return []
    if len(mm_hashes) != len(identities):
        bad = list(range(len(mm_hashes)))
    else:
        bad = [
            index
            for index, (entry, identity) in enumerate(zip(mm_hashes, identities, strict=True))
            if not _agrees(parse_mm_hash(entry), identity)
        ]
    if bad:
        first = mm_hashes[bad[0]]
        shown = first[:_SHOWN_CHARS] + ("..." if len(first) > _SHOWN_CHARS else "")
        log.warning(
            "ignoring %d of %d mm_hashes entries for %d images (they are not the images' "
            "identities); first: mm_hashes[%d] = %r",
            len(bad),
            len(mm_hashes),
            len(identities),
            bad[0],
            shown,
        )
    return bad


def _agrees(claimed: bytes | int | None, identity: bytes) -> bool:
    if isinstance(claimed, bytes):
        return claimed == identity
    if isinstance(claimed, int):
        return claimed == int.from_bytes(identity[:8], "big")
    return False
