#!/usr/bin/env bash
# The cp312 manylinux wheels scripts/device_check.sh installs on the GPU machine, which has
# no network, Python 3.12 and its own torch 2.11, triton 3.6 and transformers 5.17:
#
#   bash scripts/device_wheels.sh          # here, with PyPI in reach; makes .device-wheels/
#
# site/: exactly what the checks import beyond the packages that machine's image holds, at
# the versions constraints.txt pins. grpcio, protobuf and typing-extensions are on the image
# but go along at their pins: the generated *_pb2*.py files check the runtime's version at
# import, and pydantic-core needs typing-extensions 4.16.
# transformers/: the pinned transformers 5.24, put first only for the checks that build a
# tiny checkpoint or compare against HF's model code (bench/device_checks.py says which).
# Together with the project this must stay under 64 MiB: the script prints the size.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
OUT="${1:-$ROOT/.device-wheels}"
PY="${PYTHON:-$ROOT/.venv/bin/python}"

# What the checks import that the image lacks, or holds at a version they cannot use, traced
# from each check's run (module files mapped to their distributions): the identity hash, the
# grammar engine, settings, the gRPC health service, tracing, the async tests' plugin, and
# fla-core for the gated delta rule. Not the gateway's (pybase64, av, fastapi): no check
# starts a gateway.
SITE=(
    blake3 xgrammar apache-tvm-ffi
    pydantic pydantic-core pydantic-settings python-dotenv annotated-types typing-inspection
    typing-extensions grpcio grpcio-health-checking protobuf
    opentelemetry-api opentelemetry-sdk opentelemetry-semantic-conventions opentelemetry-proto
    pytest-asyncio "fla-core>=0.6.0,<0.7"
)

download() {  # download DEST NAME...: one cp312 manylinux wheel each, at the project's pins
    local dest="$1"
    shift
    "$PY" -m pip download -q --no-deps --only-binary=:all: --disable-pip-version-check \
        --python-version 3.12 --implementation cp --abi cp312 --abi abi3 --abi none \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
        --platform manylinux2014_x86_64 --platform any \
        -c "$ROOT/constraints.txt" -d "$dest" "$@" \
        2> >(grep -v "^WARNING: Location 'file:" >&2)  # this machine's absent local indexes
}

rm -rf "$OUT"
mkdir -p "$OUT/site" "$OUT/transformers"
download "$OUT/site" "${SITE[@]}"
download "$OUT/transformers" "transformers==5.24.0"
ls -l "$OUT/site" "$OUT/transformers"
# What travels besides: tracked files and untracked ones git does not ignore.
tree=$(cd "$ROOT" && git ls-files -z -co --exclude-standard | du -cb --files0-from=- | tail -1)
tree=${tree%%[[:space:]]*}
wheels=$(du -sb "$OUT" | cut -f1)
echo "device_wheels: wheels $((wheels >> 20)) MiB + working tree $((tree >> 20)) MiB" \
    "= $(((wheels + tree) >> 20)) MiB of the 64 MiB a device call carries"
