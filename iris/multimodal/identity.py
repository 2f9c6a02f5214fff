"""Processor fingerprint, image identity and callers' `mm_hashes` (docs/design.md §2)."""

from __future__ import annotations

import hashlib
import json
import logging
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import blake3

IDENTITY_TAG = b"iris-image-v1"
FINGERPRINT_BYTES = 32
_PARALLEL_HASH_BYTES = 1 << 20
log = logging.getLogger(__name__)


def canonical_json(value: Any) -> bytes:
    """Keys sorted, no spaces, UTF-8: the byte form every fingerprint is computed over."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def fingerprint_document(config: dict, preprocessor: dict | None) -> dict:
    """The document the fingerprint hashes, from config.json and preprocessor_config.json."""
    text_config = config.get("text_config") or {}
    hidden = text_config.get("hidden_size", config.get("hidden_size"))
    image_token_id = config.get("image_token_id", config.get("image_token_index"))
    return {
        "architectures": config.get("architectures"),
        "text_config_hidden_size": hidden,
        "vision_config": config.get("vision_config"),
        "image_token_id": image_token_id,
        "preprocessor": preprocessor,
    }


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


def processor_fingerprint(model_dir: str | Path) -> bytes:
    """SHA-256 of the canonical fingerprint document of a local HF model directory."""
    model_dir = Path(model_dir)
    config_path = model_dir / "config.json"
    if not config_path.is_file():
        raise FileNotFoundError(f"no config.json in model directory {model_dir}")
    config = json.loads(config_path.read_text())
    preprocessor = read_preprocessor_config(model_dir)
    return hashlib.sha256(canonical_json(fingerprint_document(config, preprocessor))).digest()


def image_identity(image_bytes: bytes | memoryview, fingerprint: bytes) -> bytes:
    """BLAKE3(b"iris-image-v1" ‖ fingerprint ‖ image bytes): 32 bytes."""
    if len(fingerprint) != FINGERPRINT_BYTES:
        raise ValueError(f"fingerprint must be {FINGERPRINT_BYTES} bytes, got {len(fingerprint)}")
    # Large images hash on several threads; the digest does not depend on it.
    threads = blake3.blake3.AUTO if len(image_bytes) >= _PARALLEL_HASH_BYTES else 1
    hasher = blake3.blake3(IDENTITY_TAG, max_threads=threads)
    hasher.update(fingerprint)
    hasher.update(image_bytes)
    return hasher.digest()


class MMHashesTypeError(TypeError):
    """`mm_hashes` is not a list of strings (the gateway answers 400)."""


_HEX = re.compile(r"[0-9a-fA-F]+")


def parse_mm_hash(entry: str) -> bytes | int | None:
    """16 hex digits → a 64-bit hash (int); 64 → a full identity (bytes); else None."""
    if not isinstance(entry, str) or not _HEX.fullmatch(entry):
        return None
    if len(entry) == 16:
        return int(entry, 16)
    if len(entry) == 64:
        return bytes.fromhex(entry)
    return None


def adopt_mm_hashes(mm_hashes: Any, num_images: int) -> list[bytes | int | None]:
    """Per image: the caller's identity (bytes), hash (int) or None (hash the bytes).

    A value that is not a list of strings raises MMHashesTypeError; a list of the wrong
    length is ignored as a whole (warning); one malformed entry is ignored alone (warning).
    """
    if mm_hashes is None:
        return [None] * num_images
    if not isinstance(mm_hashes, Sequence) or isinstance(mm_hashes, (str, bytes)):
        raise MMHashesTypeError(
            f"mm_hashes must be a list of hex strings, got {type(mm_hashes).__name__}"
        )
    if not all(isinstance(entry, str) for entry in mm_hashes):
        raise MMHashesTypeError("mm_hashes must be a list of hex strings")
    if len(mm_hashes) != num_images:
        log.warning("ignoring mm_hashes: %d entries for %d images", len(mm_hashes), num_images)
        return [None] * num_images
    adopted = []
    for index, entry in enumerate(mm_hashes):
        parsed = parse_mm_hash(entry)
        if parsed is None:
            log.warning("ignoring mm_hashes[%d] %r: expected 16 or 64 hex digits", index, entry)
        elif parsed == 0:  # on the wire a hash of 0 is "no hash": the item would have no key
            log.warning("ignoring mm_hashes[%d] %r: the hash 0 is reserved", index, entry)
            parsed = None
        adopted.append(parsed)
    return adopted
