#!/usr/bin/env bash
# Runs the built CPU image (scripts/build_image.sh) as the chart runs it, without Kubernetes:
# the cache, an encoder, an LLM pod on a tiny model and a gateway, each started by the image's
# entrypoint as uid 10001 with `buildah run --isolation chroot --network host`, answers one
# chat with an image through the gateway with the official `openai` client, stops them, and
# fails if the run wrote anywhere in the container but /tmp and /var/cache/iris (the chart
# mounts the root filesystem read-only; buildah run cannot, so this is where it is checked).
#
# Each service gets the environment the chart renders for it (scripts/image/chart_env.py), except
# what needs Kubernetes, replaced by its loopback equivalent (all listed in LOOPBACK below).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
# shellcheck source=scripts/image/env.sh
source scripts/image/env.sh
PY="$ROOT/.venv/bin/python"
HELM="$ROOT/.tools/helm"
IMAGE="${1:-$CPU_IMAGE}"
START_TIMEOUT_S=180  # per service: they serve within 11-32 s on a busy 2-core machine
STOP_TIMEOUT_S=30
COMPONENTS=(cache encoder llm gateway)

fail() { echo "image_check: FAILED: $*" >&2; exit 1; }
# Idempotent: the virtualenv (the openai client, the tiny model's builder), helm (renders the
# chart's settings) and redis-server (the cache's store).
bash scripts/setup.sh
for tool in buildah redis-server redis-cli curl "$HELM" "$PY"; do
    command -v "$tool" >/dev/null \
        || fail "$tool is missing (scripts/setup.sh, scripts/setup_image_tools.sh)"
done
buildah inspect --type image "$IMAGE" >/dev/null 2>&1 \
    || fail "no image $IMAGE: run scripts/build_image.sh first"

WORK="$(mktemp -d /tmp/iris-image-check.XXXXXX)"
chmod 755 "$WORK"  # the services run as uid 10001 and read the model and router from here
CTR=""
REDIS_PID=""
declare -A RUN_PIDS=()

# ---- stopping --------------------------------------------------------------------------------
descendants() {
    local child
    for child in $(pgrep -P "$1" || true); do
        echo "$child"
        descendants "$child"
    done
}
# The service's tini: signalling `buildah run` itself kills its child at once, while Kubernetes
# sends SIGTERM to the container's PID 1, which tini forwards to `iris`.
tini_of() {
    local pid
    for pid in $(descendants "$1"); do
        [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = tini ] && echo "$pid" && return 0
    done
    return 1
}
stop_service() {
    local name=$1 pid=${RUN_PIDS[$1]} tini waited=0
    kill -0 "$pid" 2>/dev/null || return 0
    if tini=$(tini_of "$pid"); then
        kill -TERM "$tini" 2>/dev/null || true
    fi
    while kill -0 "$pid" 2>/dev/null && [ "$waited" -lt "$STOP_TIMEOUT_S" ]; do
        sleep 1
        waited=$((waited + 1))
    done
    if kill -0 "$pid" 2>/dev/null; then
        echo "image_check: $name did not stop within $STOP_TIMEOUT_S s of SIGTERM; killed" >&2
        for child in $(descendants "$pid"); do kill -KILL "$child" 2>/dev/null || true; done
        kill -KILL "$pid" 2>/dev/null || true
        return 1
    fi
}
stop_all() {
    local name status=0 index
    for ((index = ${#COMPONENTS[@]} - 1; index >= 0; index--)); do  # gateway first
        name=${COMPONENTS[$index]}
        [ -n "${RUN_PIDS[$name]:-}" ] || continue
        stop_service "$name" || status=1
        wait "${RUN_PIDS[$name]}" 2>/dev/null || true
        unset "RUN_PIDS[$name]"
    done
    return "$status"
}
cleanup() {
    local status=$?
    set +e  # every step of the cleanup runs, whatever the one before it did
    stop_all
    if [ -n "$REDIS_PID" ]; then
        kill "$REDIS_PID" 2>/dev/null
        wait "$REDIS_PID" 2>/dev/null
    fi
    if [ -n "$CTR" ]; then
        buildah umount "$CTR" >/dev/null 2>&1 || true
        buildah rm "$CTR" >/dev/null 2>&1 || true
    fi
    if [ "$status" -ne 0 ]; then
        for log in "$WORK"/logs/*.log; do
            [ -f "$log" ] && { echo "---- last lines of $log"; tail -n 30 "$log"; } >&2
        done
    fi
    rm -rf "$WORK"
    exit "$status"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

free_port() {
    "$PY" -c 'import socket
s = socket.socket()
s.bind(("127.0.0.1", 0))
print(s.getsockname()[1])'
}
wait_http() {  # name url: 200 within START_TIMEOUT_S, while the service runs
    local name=$1 url=$2 deadline=$((SECONDS + START_TIMEOUT_S))
    until curl -fsS -m 2 -o /dev/null "$url" 2>/dev/null; do
        kill -0 "${RUN_PIDS[$name]}" 2>/dev/null || fail "$name exited while starting"
        [ "$SECONDS" -lt "$deadline" ] || fail "$name not healthy at $url within $START_TIMEOUT_S s"
        sleep 1
    done
}

# ---- the model, the chart's settings, the container ------------------------------------------
mkdir -p "$WORK/logs"
echo "image_check: building a tiny model (iris models make-tiny) to mount at /models"
"$ROOT/.venv/bin/iris" models make-tiny --arch qwen2_vl "$WORK/model" \
    >"$WORK/logs/make-tiny.log" 2>&1 \
    || fail "iris models make-tiny (log: $WORK/logs/make-tiny.log)"
chmod -R a+rX "$WORK/model"

# What the chart fills from Kubernetes has no value here: each is replaced in LOOPBACK.
FROM_KUBERNETES=(POD_NAME POD_NAMESPACE IRIS_CACHE_REDIS_PASSWORD IRIS_GATEWAY_API_KEYS)
"$PY" scripts/image/chart_env.py "$HELM" "$WORK" "${COMPONENTS[@]}" \
    --replace "${FROM_KUBERNETES[@]}"

declare -A PORT METRICS
for name in "${COMPONENTS[@]}"; do
    PORT[$name]=$(free_port)
    METRICS[$name]=$(free_port)
done
REDIS_PORT=$(free_port)
REDIS_PASSWORD=$("$PY" -c 'import secrets; print(secrets.token_hex(16))')
API_KEY=$("$PY" -c 'import secrets; print("iris-check-" + secrets.token_hex(16))')

# The loopback equivalents of what the chart gets from Kubernetes, per component (they are
# appended after the chart's values, and a later --env wins):
#   every service  bind 127.0.0.1 on free ports (the chart: 0.0.0.0 on the pod's own IP, fixed
#                  ports); POD_NAME / POD_NAMESPACE (the downward API) are fixed names;
#                  TINI_SUBREAPER=1: without a PID namespace tini is not PID 1, and as a
#                  subreaper it still reaps what the service's children leave
#   cache          Redis at a loopback redis-server with a generated password (the chart: the
#                  release's Redis Service and its Secret)
#   encoder, llm   device cpu (the chart: cuda on a GPU node); the cache at its loopback port
#                  (the chart: the cache Service's name)
#   gateway        static discovery of the one encoder and LLM pod (the chart: EndpointSlices
#                  read from the Kubernetes API); a generated API key (the chart: a Secret)
declare -A LOOPBACK
common() {
    local prefix=$1 name=$2
    echo "${prefix}_HOST=127.0.0.1"
    echo "${prefix}_PORT=${PORT[$name]}"
    echo "${prefix}_METRICS_PORT=${METRICS[$name]}"
    echo "POD_NAME=iris-check-$name"
    echo "POD_NAMESPACE=default"
    echo "TINI_SUBREAPER=1"
}
LOOPBACK[cache]="$(common IRIS_CACHE cache)
IRIS_CACHE_REDIS_URL=redis://127.0.0.1:$REDIS_PORT/0
IRIS_CACHE_REDIS_PASSWORD=$REDIS_PASSWORD"
LOOPBACK[encoder]="$(common IRIS_ENCODER encoder)
IRIS_ENCODER_DEVICE=cpu
IRIS_ENCODER_CACHE_ADDRESS=127.0.0.1:${PORT[cache]}"
LOOPBACK[llm]="$(common IRIS_LLM llm)
IRIS_LLM_DEVICE=cpu
IRIS_LLM_CACHE_ADDRESS=127.0.0.1:${PORT[cache]}"
LOOPBACK[gateway]="$(common IRIS_GATEWAY gateway)
IRIS_GATEWAY_DISCOVERY=static
IRIS_GATEWAY_ENCODER_ADDRESSES=127.0.0.1:${PORT[encoder]}
IRIS_GATEWAY_LLM_ADDRESSES=127.0.0.1:${PORT[llm]}
IRIS_GATEWAY_CACHE_ADDRESS=127.0.0.1:${PORT[cache]}
IRIS_GATEWAY_API_KEYS=[\"$API_KEY\"]"

CTR=$(buildah from --quiet "$IMAGE")
buildah inspect --type image "$IMAGE" >"$WORK/image.json"
mapfile -t ENTRYPOINT < <("$PY" -c 'import json, sys
print("\n".join(json.load(open(sys.argv[1]))["OCIv1"]["config"]["Entrypoint"]))' "$WORK/image.json")
[ "${#ENTRYPOINT[@]}" -gt 0 ] || fail "$IMAGE has no entrypoint"

# The chart's mounts: emptyDirs at /tmp and /var/cache/iris (one pair per service), the model
# read-only at /models, the router ConfigMap read-only at /etc/iris/router (gateway).
mounts() {
    local name=$1
    mkdir -p "$WORK/scratch/$name/tmp" "$WORK/scratch/$name/cache"
    chown -R 10001:10001 "$WORK/scratch/$name"
    echo "--volume=$WORK/scratch/$name/tmp:/tmp"
    echo "--volume=$WORK/scratch/$name/cache:/var/cache/iris"
    echo "--volume=$WORK/model:/models:ro"
    echo "--volume=$WORK/router:/etc/iris/router:ro"
}
RUN=(buildah run --isolation chroot --network host --user 10001:10001)

# Every file and directory of the container but the scratch mounts and kernel filesystems,
# with what a write changes (type, size, mode, owner, modification time).
MNT=$(buildah mount "$CTR")
snapshot() {
    (cd "$MNT" && find . -xdev \( -path ./tmp -o -path ./var/cache/iris -o -path ./proc \
        -o -path ./sys -o -path ./dev \) -prune -o -printf '%p %y %s %m %U:%G %T@\n' | sort)
}
# The paths whose line differs between two snapshots (diff exits 1 when any does).
changed() {
    { diff "$1" "$2" || true; } \
        | sed -n 's/^[<>] \(.*\) [a-z] [0-9]* [0-7]* [0-9:]* [0-9.]*$/\1/p' | sort -u
}

snapshot >"$WORK/before"
# The baseline: what buildah run itself creates (mount points, /etc/hosts, ...).
mapfile -t VOLUMES < <(mounts baseline)
"${RUN[@]}" "${VOLUMES[@]}" "$CTR" -- true
snapshot >"$WORK/baseline"

# ---- start -------------------------------------------------------------------------------------
mkdir -p "$WORK/redis"
redis-server --bind 127.0.0.1 --port "$REDIS_PORT" --requirepass "$REDIS_PASSWORD" --save '' \
    --appendonly no --dir "$WORK/redis" >"$WORK/logs/redis.log" 2>&1 &
REDIS_PID=$!

start() {
    local name=$1 env=() line
    while IFS= read -r line; do
        [ -n "$line" ] && env+=("--env=$line")
    done < <(cat "$WORK/$name.env"; echo "${LOOPBACK[$name]}")
    mapfile -t VOLUMES < <(mounts "$name")
    mapfile -t ARGS <"$WORK/$name.args"
    "${RUN[@]}" "${env[@]}" "${VOLUMES[@]}" "$CTR" -- "${ENTRYPOINT[@]}" "${ARGS[@]}" \
        >"$WORK/logs/$name.log" 2>&1 &
    RUN_PIDS[$name]=$!
    echo "image_check: started $name: ${ENTRYPOINT[*]} ${ARGS[*]}"
}
started=$SECONDS
for name in cache encoder llm; do
    start "$name"
done
for name in cache encoder llm; do
    wait_http "$name" "http://127.0.0.1:${METRICS[$name]}/healthz"
done
start gateway
wait_http gateway "http://127.0.0.1:${PORT[gateway]}/readyz"
echo "image_check: all four serving after $((SECONDS - started)) s"

# ---- one chat with an image, through the gateway, with the openai client ---------------------
"$PY" - "http://127.0.0.1:${PORT[gateway]}/v1" "$API_KEY" <<'EOF' || fail "the chat request"
import base64
import io
import sys

from openai import OpenAI
from PIL import Image

base_url, api_key = sys.argv[1:3]
image = Image.new("RGB", (64, 48), (200, 40, 40))
buffer = io.BytesIO()
image.save(buffer, format="PNG")
url = "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()
client = OpenAI(base_url=base_url, api_key=api_key, timeout=120, max_retries=0)
model = client.models.list().data[0].id
reply = client.chat.completions.create(
    model=model,
    messages=[
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "What is in this image?"},
                {"type": "image_url", "image_url": {"url": url}},
            ],
        }
    ],
    max_tokens=8,
)
usage = reply.usage
assert reply.choices[0].message.content, reply
assert usage.completion_tokens > 0 and usage.prompt_tokens > 0, usage
print(
    f"image_check: {model} answered {reply.choices[0].message.content!r} "
    f"({usage.prompt_tokens} prompt tokens with the image, {usage.completion_tokens} completion)"
)
EOF
# The image went through the encoder: its counter of encoded images moved.
curl -fsS -m 5 "http://127.0.0.1:${METRICS[encoder]}/metrics" \
    | grep -qE '^iris_encoder_images_total(\{[^}]*\})? [1-9]' \
    || fail "the encoder encoded no image (iris_encoder_images_total)"

# ---- stop, then what the run wrote -------------------------------------------------------------
for name in "${COMPONENTS[@]}"; do
    kill -0 "${RUN_PIDS[$name]}" 2>/dev/null || fail "$name exited during the check"
done
stop_all || fail "a service did not stop on SIGTERM"
snapshot >"$WORK/after"
changed "$WORK/before" "$WORK/baseline" >"$WORK/changed-baseline"
changed "$WORK/before" "$WORK/after" >"$WORK/changed-run"
WROTE=$(comm -13 "$WORK/changed-baseline" "$WORK/changed-run")
if [ -n "$WROTE" ]; then
    echo "image_check: written outside /tmp and /var/cache/iris (beyond buildah's own):" >&2
    echo "$WROTE" >&2
    fail "the services wrote to the read-only root filesystem"
fi
echo "image_check: nothing written outside /tmp and /var/cache/iris ($(wc -l \
    <"$WORK/changed-baseline") paths are buildah's own, as after \`buildah run ... true\`)"
echo "image_check: passed"
