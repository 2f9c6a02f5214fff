"""The multimodal contract (docs/design/multimodal.md): every part of Iris imports it from here."""

from iris.multimodal.blocks import (
    BLOCK_HASH_BYTES,
    block_hashes,
    next_block_hash,
    root_hash,
)
from iris.multimodal.decode import (
    DecodePolicy,
    ImageDecodeError,
    ImageHeader,
    decode_image,
    read_image_header,
)
from iris.multimodal.identity import (
    IDENTITY_TAG,
    SALT_BYTES,
    MMHashesTypeError,
    canonical_json,
    check_mm_hashes_type,
    check_salt,
    disagreeing_mm_hashes,
    image_identity,
    parse_mm_hash,
    processor_fingerprint,
    video_group_identity,
)
from iris.multimodal.item import (
    PAD_BASE,
    PAD_TAG,
    Modality,
    MultimodalItem,
    hash_of_identity,
    pad_values_for,
)
from iris.multimodal.resume import (
    AttentionLayer,
    LayerKind,
    PrefixResumeRule,
    all_full,
    layers_from_windows,
    window_first_block,
)
from iris.multimodal.spans import (
    Overlap,
    check_spans,
    chunk_overlaps,
    pad_with_offsets,
)
from iris.multimodal.vocab import check_vocab_size

__all__ = [
    "video_group_identity",
    "AttentionLayer",
    "LayerKind",
    "PrefixResumeRule",
    "all_full",
    "layers_from_windows",
    "window_first_block",
    "BLOCK_HASH_BYTES",
    "IDENTITY_TAG",
    "PAD_BASE",
    "PAD_TAG",
    "SALT_BYTES",
    "DecodePolicy",
    "ImageDecodeError",
    "ImageHeader",
    "MMHashesTypeError",
    "Modality",
    "MultimodalItem",
    "Overlap",
    "block_hashes",
    "canonical_json",
    "check_mm_hashes_type",
    "check_salt",
    "check_spans",
    "check_vocab_size",
    "chunk_overlaps",
    "decode_image",
    "disagreeing_mm_hashes",
    "hash_of_identity",
    "image_identity",
    "next_block_hash",
    "pad_values_for",
    "pad_with_offsets",
    "parse_mm_hash",
    "processor_fingerprint",
    "read_image_header",
    "root_hash",
]
