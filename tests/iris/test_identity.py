"""Fingerprint, identity, mm_hashes, block hashes and the vocab check."""

import hashlib
import json
import logging

import blake3
import pytest

from iris.multimodal import (
    MMHashesTypeError,
    adopt_mm_hashes,
    block_hashes,
    check_vocab_size,
    image_identity,
    processor_fingerprint,
)


def write_model(tmp_path, config, preprocessor=None):
    (tmp_path / "config.json").write_text(json.dumps(config, indent=2))
    if preprocessor is not None:
        (tmp_path / "preprocessor_config.json").write_text(json.dumps(preprocessor, indent=4))
    return tmp_path


CONFIG = {
    "architectures": ["Qwen2VLForConditionalGeneration"],
    "text_config": {"hidden_size": 64, "num_hidden_layers": 2},
    "vision_config": {"depth": 2, "embed_dim": 32},
    "image_token_id": 151655,
    "irrelevant": "not part of the fingerprint",
}
PREPROCESSOR = {"patch_size": 14, "merge_size": 2, "min_pixels": 3136}


def test_fingerprint_is_sha256_of_canonical_document(tmp_path):
    model = write_model(tmp_path, CONFIG, PREPROCESSOR)
    document = {
        "architectures": ["Qwen2VLForConditionalGeneration"],
        "image_token_id": 151655,
        "preprocessor": PREPROCESSOR,
        "text_config_hidden_size": 64,
        "vision_config": {"depth": 2, "embed_dim": 32},
    }
    canonical = json.dumps(document, sort_keys=True, separators=(",", ":")).encode()
    assert processor_fingerprint(model) == hashlib.sha256(canonical).digest()


def test_fingerprint_ignores_formatting_and_unrelated_keys(tmp_path):
    (tmp_path / "a").mkdir()
    a = processor_fingerprint(write_model(tmp_path / "a", CONFIG, PREPROCESSOR))
    b_config = dict(CONFIG, irrelevant="changed", extra=1)
    (tmp_path / "b").mkdir()
    b = processor_fingerprint(
        write_model(tmp_path / "b", b_config, dict(reversed(PREPROCESSOR.items())))
    )
    assert a == b


def test_fingerprint_changes_with_preprocessing(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    a = processor_fingerprint(write_model(tmp_path / "a", CONFIG, PREPROCESSOR))
    b = processor_fingerprint(write_model(tmp_path / "b", CONFIG, dict(PREPROCESSOR, min_pixels=1)))
    assert a != b


def test_fingerprint_missing_config(tmp_path):
    with pytest.raises(FileNotFoundError, match="config.json"):
        processor_fingerprint(tmp_path)


def test_image_identity_is_tagged_blake3():
    fingerprint = bytes(range(32))
    data = b"\x89PNG fake image bytes"
    expected = blake3.blake3(b"iris-image-v1" + fingerprint + data).digest()
    assert image_identity(data, fingerprint) == expected
    big = bytes(3 * 1024 * 1024)
    assert (
        image_identity(big, fingerprint)
        == blake3.blake3(b"iris-image-v1" + fingerprint + big).digest()
    )
    assert image_identity(data, bytes(32)) != expected
    with pytest.raises(ValueError, match="32 bytes"):
        image_identity(data, b"short")


def test_mm_hashes_adopted_per_entry(caplog):
    identity_hex = "ab" * 32
    adopted = adopt_mm_hashes(["00000000000000ff", identity_hex, "xyz", "abc"], 4)
    assert adopted == [255, bytes.fromhex(identity_hex), None, None]
    assert "mm_hashes[2]" in caplog.text and "mm_hashes[3]" in caplog.text


def test_the_reserved_hash_zero_is_ignored(caplog):
    # A 64-bit hash of 0 reads as "no hash" on the wire, so the image is hashed instead.
    assert adopt_mm_hashes(["0000000000000000", "0" * 64], 2) == [None, bytes(32)]
    assert "mm_hashes[0]" in caplog.text and "reserved" in caplog.text


def test_mm_hashes_wrong_length_ignored_whole(caplog):
    with caplog.at_level(logging.WARNING):
        assert adopt_mm_hashes(["00000000000000ff"], 2) == [None, None]
    assert "2 images" in caplog.text


@pytest.mark.parametrize("bad", ["00000000000000ff", 5, {"a": 1}, [1, 2]])
def test_mm_hashes_wrong_type_is_an_error(bad):
    with pytest.raises(MMHashesTypeError):
        adopt_mm_hashes(bad, 2)


def test_mm_hashes_absent():
    assert adopt_mm_hashes(None, 3) == [None, None, None]


def test_block_hashes_chain_full_blocks_only():
    fingerprint = hashlib.sha256(b"model").digest()
    ids = list(range(10))
    hashes = block_hashes(fingerprint, ids, 4)
    assert len(hashes) == 2
    h0 = fingerprint[:16]
    h1 = blake3.blake3(
        h0 + b"".join(i.to_bytes(8, "little", signed=True) for i in ids[:4])
    ).digest()[:16]
    h2 = blake3.blake3(
        h1 + b"".join(i.to_bytes(8, "little", signed=True) for i in ids[4:8])
    ).digest()[:16]
    assert hashes == [h1, h2]
    # A shared prefix gives shared leading hashes; sentinel-sized ids hash as int64.
    other = block_hashes(fingerprint, ids[:4] + [2**62] * 4, 4)
    assert other[0] == h1 and other[1] != h2
    with pytest.raises(ValueError):
        block_hashes(fingerprint, ids, 0)


def test_vocab_check():
    check_vocab_size(999_999)
    with pytest.raises(ValueError, match="1000000"):
        check_vocab_size(1_000_000)


def test_fingerprint_reads_processor_config_when_no_preprocessor_config(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    a = processor_fingerprint(write_model(tmp_path / "a", CONFIG, PREPROCESSOR))
    b_dir = write_model(tmp_path / "b", CONFIG)
    (b_dir / "processor_config.json").write_text(json.dumps({"image_processor": PREPROCESSOR}))
    assert processor_fingerprint(b_dir) == a
