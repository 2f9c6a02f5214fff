#!/usr/bin/env bash
# Rewrites constraints.txt from the environment scripts/setup.sh built (.venv): every
# installed distribution, pinned exactly. Run it after a change of dependencies, once the
# suite passes on the environment, and commit the file with the change.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${IRIS_VENV:-$ROOT/.venv}"
{
    echo "# The tested environment, pinned: scripts/setup.sh installs under it (pip -c), and so"
    echo "# does docker/Dockerfile. Written by scripts/pin_constraints.sh; do not edit by hand."
    echo "# Local version labels (torch's +cpu) are dropped, so the CUDA image matches too."
    # The project itself is editable and never pinned; it is what the constraints are for.
    "$VENV/bin/python" -m pip freeze --all --exclude-editable --disable-pip-version-check \
        | grep -v '^iris==' \
        | sed -E 's/\+[A-Za-z0-9.]+$//' \
        | LC_ALL=C sort -f
} > "$ROOT/constraints.txt"
echo "wrote $ROOT/constraints.txt ($(grep -vc '^#' "$ROOT/constraints.txt") pins)"
