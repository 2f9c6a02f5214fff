#!/usr/bin/env bash
# Makes .venv-bench: the field's own load generators, aiperf and guidellm, at pinned versions,
# in a virtualenv of their own (aiperf brings its own torch, which must never reach .venv).
# bench/third_party.py runs them against `iris up`. Idempotent.
#
#   bash scripts/bench_clients.sh           install under bench/clients-constraints.txt
#   bash scripts/bench_clients.sh --repin   install the two pins afresh, rewrite the constraints
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${IRIS_BENCH_VENV:-$ROOT/.venv-bench}"
PINS="$ROOT/bench/clients-constraints.txt"
# The two clients; every other distribution they pull is pinned in $PINS.
CLIENTS=(aiperf==0.13.0 guidellm==0.8.1)
cd "$ROOT"

if [ ! -x "$VENV/bin/python" ]; then
    python3.11 -m venv "$VENV" 2>/dev/null || python3 -m venv "$VENV"
fi
PY="$VENV/bin/python"
STAMP="$VENV/.clients-installed"
if [ "${1:-}" = "--repin" ]; then
    "$PY" -m pip install -q "${CLIENTS[@]}"
    {
        echo "# .venv-bench pinned: scripts/bench_clients.sh installs aiperf and guidellm under it"
        echo "# (pip -c). Written by scripts/bench_clients.sh --repin; do not edit by hand."
        "$PY" -m pip freeze --all --disable-pip-version-check | LC_ALL=C sort -f
    } > "$PINS"
    touch "$STAMP"
    echo "wrote $PINS ($(grep -vc '^#' "$PINS") pins)"
elif [ ! -f "$STAMP" ] || [ "$PINS" -nt "$STAMP" ]; then
    "$PY" -m pip install -q -c "$PINS" "${CLIENTS[@]}"
    touch "$STAMP"
fi
"$VENV/bin/aiperf" --version >/dev/null 2>&1 || "$VENV/bin/aiperf" --help >/dev/null
"$VENV/bin/guidellm" --version
