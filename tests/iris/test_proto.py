"""The committed generated protobuf code is what protoc produces from the .proto files."""

import shutil
from pathlib import Path

from iris.proto import generate
from iris.proto.common_pb2 import MultimodalItem, SamplingParams, Span


def test_generated_code_matches_sources(tmp_path):
    root = generate.ROOT
    for proto in generate.proto_files(root):
        target = tmp_path / proto.relative_to(root)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(proto, target)
    generate.generate(root=tmp_path, out=tmp_path)
    generated = sorted(p for p in tmp_path.rglob("*_pb2*.py*"))
    assert generated, "no generated files"
    for path in generated:
        committed = root / path.relative_to(tmp_path)
        assert committed.is_file(), f"{committed} is not committed"
        assert committed.read_text() == path.read_text(), (
            f"{committed} is stale: run python -m iris.proto.generate"
        )


def test_item_round_trip_keeps_fixed64_hash():
    item = MultimodalItem(identity=b"\xff" * 32, hash=2**64 - 1, token_count=6)
    item.offsets.append(Span(start=3, end=8))
    item.grid.extend([1, 4, 6])
    decoded = MultimodalItem.FromString(item.SerializeToString())
    assert decoded.hash == 2**64 - 1 and decoded.offsets[0].end == 8
    assert list(decoded.grid) == [1, 4, 6]
    params = SamplingParams(temperature=0.0, max_tokens=5)
    assert not params.HasField("seed")


def test_every_proto_dir_is_listed():
    root = Path(generate.ROOT)
    found = {str(p.parent.relative_to(root)) for p in root.glob("*/proto/*.proto")}
    assert found <= set(generate.PROTO_DIRS)
