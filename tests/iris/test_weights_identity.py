"""The fingerprint knows the weights (issue 34, item 6): two fine-tunes of one base (same
config, same preprocessor, same file names and sizes) get different fingerprints; a named
revision stands for the bytes; the digest is computed once per directory, remembered by
each file's size and modification time."""

from __future__ import annotations

import json
import os

import pytest

from iris.multimodal import processor_fingerprint
from iris.multimodal import weights as weights_module

CONFIG = {
    "architectures": ["Qwen2VLForConditionalGeneration"],
    "text_config": {"hidden_size": 64},
    "vision_config": {"depth": 2},
    "image_token_id": 151655,
}


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    monkeypatch.setattr(weights_module, "_memo", {})


def fine_tune(path, weights: bytes):
    path.mkdir()
    (path / "config.json").write_text(json.dumps(CONFIG))
    (path / "model.safetensors").write_bytes(weights)
    return path


def test_two_fine_tunes_with_one_config_differ(tmp_path):
    a = fine_tune(tmp_path / "a", b"\x01" * 4096)
    b = fine_tune(tmp_path / "b", b"\x02" * 4096)  # same name, same size, other bytes
    assert processor_fingerprint(a) != processor_fingerprint(b)
    same = fine_tune(tmp_path / "same", b"\x01" * 4096)
    assert processor_fingerprint(same) == processor_fingerprint(a)


def test_a_named_revision_stands_for_the_bytes(tmp_path):
    a = fine_tune(tmp_path / "a", b"\x01" * 64)
    b = fine_tune(tmp_path / "b", b"\x02" * 64)
    assert processor_fingerprint(a, "v7") == processor_fingerprint(b, "v7")
    assert processor_fingerprint(a, "v7") != processor_fingerprint(a, "v8")
    assert processor_fingerprint(a, "v7") != processor_fingerprint(a)


def test_the_digest_is_remembered_by_size_and_mtime(tmp_path):
    model = fine_tune(tmp_path / "m", b"\x01" * 4096)
    weights = model / "model.safetensors"
    first = processor_fingerprint(model)
    stat = weights.stat()
    # Other bytes, same size and modification time: the remembered digest is used (in
    # this process, and from the disk cache in a fresh one), so nothing was hashed again.
    weights.write_bytes(b"\x03" * 4096)
    os.utime(weights, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert processor_fingerprint(model) == first
    weights_module._memo.clear()
    assert processor_fingerprint(model) == first
    # A new modification time: hashed again, and the new bytes count.
    os.utime(weights, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))
    assert processor_fingerprint(model) != first
