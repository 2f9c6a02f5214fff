"""Regenerate the committed protobuf / gRPC Python modules of Iris.

Run ``python -m iris.proto.generate`` after editing a .proto. Every .proto of the repository
is compiled with the repository root as the include path, so service protos import the
shared one as ``import "iris/proto/common.proto";``.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PROTO_DIRS = ["iris/proto", "embedding_cache_svc/proto", "encoder_svc/proto", "llm_svc/proto"]


def proto_files(root: Path = ROOT) -> list[Path]:
    files = []
    for folder in PROTO_DIRS:
        files.extend(sorted((root / folder).glob("*.proto")))
    return files


def generate(root: Path = ROOT, out: Path | None = None) -> list[Path]:
    """Compile every .proto under `root` into `out` (default: beside each source)."""
    from grpc_tools import protoc

    out = out or root
    files = proto_files(root)
    if not files:
        return []
    include = Path(protoc.__file__).parent / "_proto"
    args = [
        "protoc",
        f"-I{root}",
        f"-I{include}",
        f"--python_out={out}",
        f"--pyi_out={out}",
        f"--grpc_python_out={out}",
        *[str(path.relative_to(root)) for path in files],
    ]
    if protoc.main(args) != 0:
        raise RuntimeError(f"protoc failed on {', '.join(map(str, files))}")
    return files


if __name__ == "__main__":
    generated = generate()
    print(f"generated {len(generated)} proto file(s)", file=sys.stderr)
