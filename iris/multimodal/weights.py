"""The identity of a model's weights, for the fingerprint (docs/design/multimodal.md).

Two fine-tunes of one base share config.json, preprocessor config, headers and file
sizes, so none of those tells them apart: only the weights' bytes do. The deployer may
name the weights (`model_revision`: an HF commit hash, or any version string); when it is
unset, the identity is a BLAKE3 digest over every weight file's name and bytes. Hashing
gigabytes costs seconds, so a digest is computed once per directory and remembered, in
this process and in a small JSON file under the user's cache directory, keyed by each
file's name, size and modification time: a changed file is hashed again.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from pathlib import Path

import blake3

log = logging.getLogger(__name__)

WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf")
DIGEST_TAG = b"iris-weights-v1"
_READ_BYTES = 16 << 20
_memo: dict[str, tuple[list, str]] = {}
_lock = threading.Lock()


def weights_identity(model_dir: str | Path, revision: str = "") -> str:
    """ "revision:<name>" when the deployer named the weights, else "blake3:<hex digest>"."""
    if revision:
        return f"revision:{revision}"
    return f"blake3:{weights_digest(model_dir)}"


def weight_files(model_dir: Path) -> list[Path]:
    """The weight files of a model directory (recursively), in a stable order."""
    return sorted(
        path
        for path in model_dir.rglob("*")
        if path.is_file() and path.name.endswith(WEIGHT_SUFFIXES)
    )


def _stamp(model_dir: Path, files: list[Path]) -> list:
    stamps = []
    for path in files:
        stat = path.stat()
        stamps.append([path.relative_to(model_dir).as_posix(), stat.st_size, stat.st_mtime_ns])
    return stamps


def weights_digest(model_dir: str | Path) -> str:
    """BLAKE3 over each weight file's relative name, size and bytes (hex). Computed once
    per directory while no file's size or modification time changes."""
    model_dir = Path(model_dir).resolve()
    key = str(model_dir)
    files = weight_files(model_dir)
    stamps = _stamp(model_dir, files)
    with _lock:
        known = _memo.get(key) or _read_disk_cache().get(key)
        if known is not None and list(known[0]) == stamps:
            _memo[key] = (stamps, known[1])
            return known[1]
        hasher = blake3.blake3(DIGEST_TAG, max_threads=blake3.blake3.AUTO)
        for path, (name, size, _) in zip(files, stamps, strict=True):
            hasher.update(f"{name}\0{size}\0".encode())
            with path.open("rb") as handle:
                while chunk := handle.read(_READ_BYTES):
                    hasher.update(chunk)
        digest = hasher.hexdigest()
        _memo[key] = (stamps, digest)
        _write_disk_cache(key, stamps, digest)
        if not files:
            log.warning("no weight files in %s: the fingerprint cannot tell weights apart", key)
        return digest


def _cache_path() -> Path:
    root = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(root) / "iris" / "weights-digests.json"


def _read_disk_cache() -> dict:
    try:
        return json.loads(_cache_path().read_text())
    except (OSError, ValueError):
        return {}


def _write_disk_cache(key: str, stamps: list, digest: str) -> None:
    # Best effort: a read-only home only costs hashing again in the next process.
    path = _cache_path()
    try:
        known = _read_disk_cache()
        known[key] = [stamps, digest]
        path.parent.mkdir(parents=True, exist_ok=True)
        scratch = path.with_suffix(f".{os.getpid()}.tmp")
        scratch.write_text(json.dumps(known))
        scratch.replace(path)
    except OSError as err:
        log.info("could not save the weights digest cache at %s: %s", path, err)
