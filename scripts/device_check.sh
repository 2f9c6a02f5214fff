#!/usr/bin/env bash
# Every check that has never run on a GPU, in one command (under 9 minutes on one H100/H200):
#
#   bash scripts/device_check.sh OUT_DIR              # on the GPU machine
#   bash scripts/device_check.sh --dry-run OUT_DIR    # here: each check's CPU twin
#
# Extra arguments (--only NAME,..., --fast, --list) go to bench/device_checks.py, which runs
# the checks and writes OUT_DIR/device_check.json and device_check.log (docs/status.md).
#
# On the GPU machine the checks run under its own python3, torch, triton and transformers;
# what they import beyond those comes from .device-wheels/ (scripts/device_wheels.sh makes
# it here; carry it along), installed into a scratch folder, never into the machine's
# environment. The exit status is 1 when a check failed.
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
WHEELS="$ROOT/.device-wheels"
cd "$ROOT"

dry_run=0
for arg in "$@"; do
    [ "$arg" = "--dry-run" ] && dry_run=1
done

if [ "$dry_run" = 1 ]; then
    PY="${PYTHON:-$ROOT/.venv/bin/python}"
    exec "$PY" bench/device_checks.py "$@"
fi

PY="${PYTHON:-python3}"
SCRATCH="$(mktemp -d /tmp/iris-device.XXXXXX)"
extra=()
install() {  # install FOLDER's wheels into TARGET, no index, no dependencies resolved
    local folder="$1" target="$2"
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
        --disable-pip-version-check --target "$target" "$folder"/*.whl
}
if compgen -G "$WHEELS/site/*.whl" >/dev/null; then
    if install "$WHEELS/site" "$SCRATCH/site"; then
        extra+=(--site "$SCRATCH/site")
    else
        echo "device_check: the carried wheels did not install; checks run without them" >&2
    fi
else
    echo "device_check: no $WHEELS/site (scripts/device_wheels.sh makes it)" >&2
fi
if compgen -G "$WHEELS/transformers/*.whl" >/dev/null; then
    install "$WHEELS/transformers" "$SCRATCH/transformers" \
        && extra+=(--transformers "$SCRATCH/transformers")
fi
"$PY" bench/device_checks.py "$@" "${extra[@]}"
status=$?
rm -rf "$SCRATCH"
exit "$status"
