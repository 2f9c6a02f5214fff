#!/usr/bin/env bash
# Sets up (idempotently), starts the whole platform locally with `iris up` on the demo
# model, and sends one real chat request with an image through the gateway.
# Pass --keep-running to leave it serving afterwards (Ctrl-C stops everything).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
bash scripts/setup.sh
EXIT_FLAG="--exit-after-demo"
if [ "${1:-}" = "--keep-running" ]; then
    EXIT_FLAG=""
    shift
fi
exec .venv/bin/iris up --demo-request $EXIT_FLAG "$@"
