"""Iris's top-level packages must not shadow a distribution that a dependency probes for.

transformers decides whether Hugging Face's `kernels` distribution is installed by finding
the import name `kernels` and reading the version of a distribution of that name; when
both are found it imports names from the module. Iris's Triton kernels once lived in a
top-level package called `kernels`: on a machine where the real distribution was also
installed, transformers found Iris's module under that name and every import of a
processor failed (`cannot import name 'CUDAProperties' from 'kernels'`). The package is
`iris_kernels` now; this test puts a `kernels` distribution's metadata on the path, as such
a machine has, and imports a processor in a fresh interpreter."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

# Names that transformers (or torch) probe with find_spec and then import from.
PROBED_NAMES = ("kernels", "fla", "flash_attn", "liger_kernel", "triton_kernels")


def test_no_top_level_package_takes_a_probed_name():
    taken = [name for name in PROBED_NAMES if (REPO / name).exists()]
    assert taken == [], f"top-level {taken} would shadow the distributions of those names"


def test_processor_imports_with_a_kernels_distribution_installed(tmp_path):
    dist_info = tmp_path / "kernels-0.18.5.dist-info"
    dist_info.mkdir()
    (dist_info / "METADATA").write_text("Metadata-Version: 2.1\nName: kernels\nVersion: 0.18.5\n")
    probe = (
        "from transformers.models.qwen3_vl.processing_qwen3_vl import Qwen3VLProcessor\n"
        "import importlib.metadata\n"
        "print(importlib.metadata.version('kernels'))\n"
    )
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), str(tmp_path)]))
    done = subprocess.run(
        [sys.executable, "-c", probe],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "0.18.5"  # the fake distribution was visible
