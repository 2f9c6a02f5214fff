#!/usr/bin/env bash
# Sets up (idempotently), checks ruff (lint + format), then runs the whole test suite.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
bash scripts/setup.sh
export PATH="$ROOT/.tools:$PATH"
.venv/bin/ruff check .
.venv/bin/ruff format --check . >/dev/null
.venv/bin/python -m pytest -q "$@"
