"""An image's layers, as `buildah push --disable-compression IMAGE dir:DIR` writes them: print
each one's size and the build step that made it, largest first, and fail when a layer holds a
host configuration file (by content, under any name) or any pip configuration file.

    python scripts/image/layers.py DIR [HOST_CONFIG_FILE ...]

Used by scripts/build_image.sh: the host's pip and apt configuration is mounted into the build
steps, and this is the check that none of it was copied into the image.
"""

from __future__ import annotations

import hashlib
import json
import sys
import tarfile
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

# pip reads these names wherever its configuration lives (/etc, XDG dirs, home, a venv).
PIP_CONFIG_NAMES = {"pip.conf", "pip.ini"}


@dataclass
class Layer:
    path: Path
    size: int
    step: str


def layers(image_dir: Path) -> list[Layer]:
    """The image's layers in order, each with the history entry (build step) that made it."""
    manifest = json.loads((image_dir / "manifest.json").read_text())
    config_digest = manifest["config"]["digest"].split(":", 1)[1]
    config = json.loads((image_dir / config_digest).read_text())
    steps = [h.get("created_by", "") for h in config["history"] if not h.get("empty_layer")]
    blobs = [image_dir / layer["digest"].split(":", 1)[1] for layer in manifest["layers"]]
    assert len(steps) == len(blobs), f"{len(steps)} history entries for {len(blobs)} layers"
    return [Layer(b, b.stat().st_size, s) for b, s in zip(blobs, steps, strict=True)]


def forbidden_members(layer: Layer, host_files: dict[int, set[str]]) -> list[str]:
    """Members of the layer that are a pip configuration file or have a host file's content
    (`host_files`: sha256 digests by size, so only files of a matching size are read)."""
    found = []
    with tarfile.open(layer.path) as tar:
        for member in tar:
            if not member.isfile():
                continue
            name = PurePosixPath(member.name)
            if name.name in PIP_CONFIG_NAMES:
                found.append(f"{member.name} (a pip configuration file)")
            elif member.size in host_files:
                digest = hashlib.sha256(tar.extractfile(member).read()).hexdigest()
                if digest in host_files[member.size]:
                    found.append(f"{member.name} (the content of a host configuration file)")
    return found


def short(step: str, width: int = 90) -> str:
    step = " ".join(step.replace("/bin/sh -c ", "").split())
    return step if len(step) <= width else step[: width - 3] + "..."


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__, file=sys.stderr)
        return 2
    image_layers = layers(Path(argv[0]))
    host_files: dict[int, set[str]] = {}
    for name in argv[1:]:
        data = Path(name).read_bytes()
        host_files.setdefault(len(data), set()).add(hashlib.sha256(data).hexdigest())

    total = sum(layer.size for layer in image_layers)
    print(f"image_layers: {len(image_layers)} layers, {total / 1e9:.2f} GB uncompressed")
    for layer in sorted(image_layers, key=lambda layer: -layer.size)[:5]:
        print(f"  {layer.size / 1e6:8.1f} MB  {short(layer.step)}")

    failures = []
    for index, layer in enumerate(image_layers):
        failures += [f"layer {index}: {m}" for m in forbidden_members(layer, host_files)]
    if failures:
        print("image_layers: FAILED: host configuration in the image:", file=sys.stderr)
        for failure in failures:
            print(f"  {failure}", file=sys.stderr)
        return 1
    print(
        f"image_layers: no layer holds a pip configuration file or any of the "
        f"{len(argv) - 1} host configuration files mounted into the build"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
