"""The item, its identity and its sentinels, exactly as docs/design/multimodal.md writes them."""

import hashlib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from iris.multimodal import PAD_BASE, Modality, MultimodalItem, pad_values_for


def reference_pad_values(key: bytes) -> list[int]:
    # Written out independently of the implementation, from docs/design/multimodal.md's formula.
    d = hashlib.sha256(b"iris-mm-pad-v1" + key).digest()
    return [
        1_000_000 + (int.from_bytes(d[8 * i : 8 * i + 8], "big") & (2**62 - 1)) for i in range(4)
    ]


def test_constructible_with_only_modality():
    item = MultimodalItem(Modality.IMAGE)
    assert item.identity is None and item.hash is None and item.pad_values == ()
    with pytest.raises(ValueError, match="no pad values"):
        item.padding_sequence(3)


@given(st.binary(min_size=32, max_size=32))
def test_identity_sets_hash_and_sentinels(identity):
    item = MultimodalItem(Modality.IMAGE)
    item.set_identity(identity)
    assert item.hash == int.from_bytes(identity[:8], "big")
    assert list(item.pad_values) == reference_pad_values(identity)
    assert all(PAD_BASE <= v < PAD_BASE + 2**62 for v in item.pad_values)
    assert item.key == identity


@given(st.integers(min_value=0, max_value=2**64 - 1))
def test_caller_hash_uses_its_eight_bytes(value):
    item = MultimodalItem(Modality.IMAGE)
    item.set_hash(value)
    assert item.identity is None
    assert list(item.pad_values) == reference_pad_values(value.to_bytes(8, "big"))
    assert item.key == value.to_bytes(8, "big")


@pytest.mark.parametrize("bad", [b"short", b"x" * 33, "a" * 32])
def test_bad_identity_rejected(bad):
    with pytest.raises(ValueError, match="32 bytes"):
        MultimodalItem(Modality.IMAGE).set_identity(bad)


@pytest.mark.parametrize("bad", [-1, 2**64, 1.5, True])
def test_bad_hash_rejected(bad):
    with pytest.raises(ValueError, match="64-bit"):
        MultimodalItem(Modality.IMAGE).set_hash(bad)


@given(st.binary(min_size=32, max_size=32), st.integers(min_value=0, max_value=50))
def test_padding_sequence_rotates(identity, length):
    item = MultimodalItem(Modality.IMAGE)
    item.set_identity(identity)
    sequence = item.padding_sequence(length)
    assert len(sequence) == length
    assert sequence == [item.pad_values[i % 4] for i in range(length)]
    if length >= 2:
        assert sequence[0] != sequence[1] or item.pad_values[0] == item.pad_values[1]


def test_pad_values_differ_between_identities():
    assert pad_values_for(b"\x00" * 32) != pad_values_for(b"\x01" + b"\x00" * 31)
