#!/usr/bin/env bash
# Sets up (idempotently), checks ruff (lint + format), then runs the whole test suite.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
bash scripts/setup.sh
export PATH="$ROOT/.tools:$PATH"
.venv/bin/ruff check .
.venv/bin/ruff format --check . >/dev/null
# The suite's checkpoints (tiny random ones and the demo), built once per builder change.
.venv/bin/python -m tests.fixtures.models
# Two worker processes (pytest-xdist), each taking whole test files, so a module's platform
# is started once: most of the suite's time is services starting, waiting on each other or on
# a fault to be noticed, which a second worker overlaps. The files that use a shared platform
# go to one worker together, so each shared platform starts once (tests/fixtures/platform.py
# gives xdist that scheduler for loadfile). Files go out in collection order
# (--no-loadscope-reorder): a shared platform is stopped after the last test to use it
# (tests/fixtures/platform.py), which holds only if no worker runs a later file before an
# earlier one. IRIS_TEST_WORKERS=0 runs it in one process.
.venv/bin/python -m pytest -q -n "${IRIS_TEST_WORKERS:-2}" --dist loadfile \
    --no-loadscope-reorder "$@"
