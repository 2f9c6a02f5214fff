"""Building checkpoints into a directory atomically, and a cache keyed by the builder code.

A build writes into a temporary sibling directory and renames it into place when complete,
so a crash or a concurrent builder never leaves a half-written checkpoint under the name.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

# iris/models/text_tiny.py
TEXT_TINY_ARCHS = (
    "qwen3", "qwen3_moe", "qwen2_moe", "gemma3_text", "gemma4_text", "gemma4_text_ple",
    "gemma4_text_moe", "mistral",
)  # fmt: skip
VLM_TINY_ARCHS = (
    "qwen2_vl",
    "qwen2_5_vl",
    "idefics3",
    "gemma3",
    "gemma4",
    "gemma4_moe",
    "gemma4_e",
    "internvl",
    "internvl_moe",
    "mistral3",
    "qwen3_vl",
    "qwen3_vl_moe",
    "qwen3_5_vl",
    "qwen3_5_vl_moe",
)
# Qwen3.5 and Qwen3.5-MoE as plain (hybrid) language models: their builder is
# qwen3_5/tiny.py, with the image-text ones.
QWEN3_5_TEXT_ARCHS = ("qwen3_5", "qwen3_5_moe")
TINY_ARCHS = (*VLM_TINY_ARCHS, *QWEN3_5_TEXT_ARCHS, *TEXT_TINY_ARCHS)
COMPLETE_MARKER = ".iris-complete"
_PACKAGE = Path(__file__).parent


def _tiny_builder(arch: str) -> Callable[[Path], None]:
    if arch == "qwen2_vl":
        from iris.models.qwen2_vl.tiny import build
    elif arch == "qwen2_5_vl":
        from iris.models.qwen2_vl.tiny import build_qwen2_5 as build
    elif arch == "idefics3":
        from iris.models.idefics3.tiny import build
    elif arch == "gemma3":
        from iris.models.gemma3.tiny import build
    elif arch in ("gemma4", "gemma4_moe", "gemma4_e"):
        from functools import partial

        from iris.models.gemma4.tiny import build as build_gemma4

        build = partial(build_gemma4, arch=arch)
    elif arch == "qwen3_5":
        from iris.models.qwen3_5.tiny import build
    elif arch == "qwen3_5_moe":
        from iris.models.qwen3_5.tiny import build_moe as build
    elif arch == "qwen3_5_vl":
        from iris.models.qwen3_5.tiny import build_vl as build
    elif arch == "qwen3_5_vl_moe":
        from iris.models.qwen3_5.tiny import build_vl_moe as build
    elif arch == "qwen3_vl":
        from iris.models.qwen3_vl.tiny import build
    elif arch == "qwen3_vl_moe":
        from iris.models.qwen3_vl.tiny import build_moe as build
    elif arch == "internvl":
        from iris.models.internvl.tiny import build
    elif arch == "mistral3":
        from iris.models.mistral3.tiny import build
    elif arch == "internvl_moe":
        from functools import partial

        from iris.models.internvl.tiny import build as build_internvl

        build = partial(build_internvl, text_model="qwen3_moe")
    elif arch in TEXT_TINY_ARCHS:
        from functools import partial

        from iris.models.text_tiny import build as build_text

        build = partial(build_text, arch)
    else:
        raise ValueError(f"unknown tiny arch {arch!r} (choose from: {', '.join(TINY_ARCHS)})")
    return build


def build_atomically(out_dir: str | Path, build: Callable[[Path], None]) -> Path:
    """Run `build(tmp)` and move the result to `out_dir`; an existing complete `out_dir`
    is kept (returns at once). Safe against concurrent builders of the same directory."""
    out_dir = Path(out_dir)
    if (out_dir / COMPLETE_MARKER).is_file():
        return out_dir
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", dir=out_dir.parent))
    try:
        build(tmp)
        (tmp / COMPLETE_MARKER).write_text("ok\n")
        os.chmod(tmp, 0o755)  # mkdtemp makes it private; a checkpoint is for every reader
        if out_dir.exists() and not (out_dir / COMPLETE_MARKER).is_file():
            shutil.rmtree(out_dir, ignore_errors=True)  # a stale partial directory
        try:
            os.rename(tmp, out_dir)
        except OSError:
            if not (out_dir / COMPLETE_MARKER).is_file():
                raise
            # Another builder finished first; its result is as good as ours.
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out_dir


def make_tiny(arch: str, out_dir: str | Path) -> Path:
    """A tiny random checkpoint of family `arch` in `out_dir` (kept if already complete)."""
    return build_atomically(out_dir, _tiny_builder(arch))


def source_key(*relative_files: str) -> str:
    """12 hex digits over the builder sources: a cached checkpoint is rebuilt when they change."""
    digest = hashlib.sha256()
    for name in relative_files:
        digest.update(name.encode())
        digest.update((_PACKAGE / name).read_bytes())
    return digest.hexdigest()[:12]


# qwen3_5/tiny.py builds the VLMs with Qwen2-VL's tokens and Qwen3-VL's vision tower.
_QWEN3_5_SOURCES = (
    "tokenizer_build.py",
    "qwen2_vl/tiny.py",
    "qwen3_vl/tiny.py",
    "qwen3_5/tiny.py",
    "build.py",
)
TINY_SOURCES = {
    "qwen2_vl": ("tokenizer_build.py", "qwen2_vl/tiny.py", "build.py"),
    "qwen2_5_vl": ("tokenizer_build.py", "qwen2_vl/tiny.py", "build.py"),
    "idefics3": ("tokenizer_build.py", "idefics3/tiny.py", "build.py"),
    "gemma3": ("tokenizer_build.py", "gemma3/tiny.py", "text_tiny.py", "build.py"),
    **{
        arch: ("tokenizer_build.py", "gemma4/tiny.py", "text_tiny.py", "build.py")
        for arch in ("gemma4", "gemma4_moe", "gemma4_e")
    },
    **{
        arch: _QWEN3_5_SOURCES
        for arch in ("qwen3_5", "qwen3_5_moe", "qwen3_5_vl", "qwen3_5_vl_moe")
    },
    "qwen3_vl": ("tokenizer_build.py", "qwen2_vl/tiny.py", "qwen3_vl/tiny.py", "build.py"),
    "qwen3_vl_moe": ("tokenizer_build.py", "qwen2_vl/tiny.py", "qwen3_vl/tiny.py", "build.py"),
    "internvl": ("tokenizer_build.py", "internvl/tiny.py", "build.py"),
    "internvl_moe": ("tokenizer_build.py", "internvl/tiny.py", "build.py"),
    "mistral3": ("tokenizer_build.py", "mistral3/tiny.py", "build.py"),
    **{arch: ("tokenizer_build.py", "text_tiny.py", "build.py") for arch in TEXT_TINY_ARCHS},
}
DEMO_SOURCES = ("demo.py", "idefics3/tiny.py", "build.py")


def _prune_stale(current: Path, stem: str) -> None:
    # Builds from older builder code are never used again; the demo is ~0.5 GB each.
    for sibling in current.parent.glob(f"{stem}-*"):
        key = sibling.name[len(stem) + 1 :]
        if sibling != current and sibling.is_dir() and len(key) == 12 and "-" not in key:
            shutil.rmtree(sibling, ignore_errors=True)


def cached_tiny(arch: str, cache_root: str | Path) -> Path:
    """The tiny checkpoint under cache_root/tiny-<arch>-<source key>/, built if missing."""
    key = source_key(*TINY_SOURCES[arch])
    path = make_tiny(arch, Path(cache_root) / f"tiny-{arch}-{key}")
    _prune_stale(path, f"tiny-{arch}")
    return path


def cached_demo(cache_root: str | Path) -> Path:
    """The demo checkpoint under cache_root/demo-<source key>/, built if missing."""
    from iris.models.demo import make_demo

    key = source_key(*DEMO_SOURCES)
    path = make_demo(Path(cache_root) / f"demo-{key}")
    _prune_stale(path, "demo")
    return path
