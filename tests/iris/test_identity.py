"""Fingerprint, identity, mm_hashes, block hashes and the vocab check."""

import hashlib
import json
import logging

import blake3
import pytest

from iris.multimodal import (
    MMHashesTypeError,
    block_hashes,
    check_mm_hashes_type,
    check_vocab_size,
    disagreeing_mm_hashes,
    image_identity,
    next_block_hash,
    processor_fingerprint,
    root_hash,
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
        "weights": "blake3:" + blake3.blake3(b"iris-weights-v1").hexdigest(),  # no files
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


def test_a_salt_keys_the_identity():
    fingerprint, data = bytes(range(32)), b"\x89PNG fake image bytes"
    salt = bytes(reversed(range(32)))
    salted = image_identity(data, fingerprint, salt)
    assert salted == blake3.blake3(b"iris-image-v1" + fingerprint + data, key=salt).digest()
    assert salted != image_identity(data, fingerprint)
    assert salted != image_identity(data, fingerprint, bytes(32))
    assert image_identity(data, fingerprint, b"") == image_identity(data, fingerprint)
    with pytest.raises(ValueError, match="salt must be 32 bytes"):
        image_identity(data, fingerprint, b"short")


def test_mm_hashes_that_are_not_the_identity_are_reported(caplog):
    identities = [bytes(range(32)), bytes(32)]
    agree = [identities[0].hex(), identities[1][:8].hex()]
    assert disagreeing_mm_hashes(agree, identities) == []
    assert disagreeing_mm_hashes(None, identities) == []
    forged = ["ab" * 32, "xyz" * 1000]
    with caplog.at_level(logging.WARNING):
        assert disagreeing_mm_hashes(forged, identities) == [0, 1]
    # One line per request, and a caller's long entry is cut.
    lines = [r for r in caplog.records if "mm_hashes" in r.getMessage()]
    assert len(lines) == 1 and len(lines[0].getMessage()) < 400


def test_mm_hashes_of_the_wrong_length_are_all_reported():
    assert disagreeing_mm_hashes(["00" * 8], [bytes(32), bytes(32)]) == [0]


@pytest.mark.parametrize("bad", ["00000000000000ff", 5, {"a": 1}, [1, 2]])
def test_mm_hashes_wrong_type_is_an_error(bad):
    with pytest.raises(MMHashesTypeError):
        check_mm_hashes_type(bad)
    with pytest.raises(MMHashesTypeError):
        disagreeing_mm_hashes(bad, [bytes(32), bytes(32)])


def test_a_salt_roots_the_block_hashes():
    fingerprint = hashlib.sha256(b"model").digest()
    ids, salt = list(range(8)), bytes(range(32))
    shared, salted = block_hashes(fingerprint, ids, 4), block_hashes(fingerprint, ids, 4, salt)
    assert not set(shared) & set(salted)
    assert (
        root_hash(fingerprint, salt)
        == (blake3.blake3(b"iris-prefix-v1" + fingerprint, key=salt).digest()[:16])
    )
    assert salted[0] == next_block_hash(root_hash(fingerprint, salt), ids[:4])
    assert block_hashes(fingerprint, ids, 4, bytes(31) + b"\x01") != salted


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
