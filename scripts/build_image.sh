#!/usr/bin/env bash
# Builds docker/Dockerfile without a Docker engine: buildah (daemonless, as root, chroot
# isolation) on a Python base made from Debian's packages with mmdebstrap.
#
#   bash scripts/build_image.sh           # localhost/iris-python:3.11, then localhost/iris:<v>-cpu
#   bash scripts/build_image.sh --cuda    # localhost/iris:<v> (PyPI's CUDA torch), not in CI
#   --no-cache: rebuild the base and every layer (what a machine without earlier builds does)
#
# Why a base of our own: the Dockerfile starts FROM python:3.11-slim-bookworm, and no container
# registry can be reached from the development and CI machines, only Debian's and Python's
# package registries. localhost/iris-python:3.11 stands in for it (Debian bookworm, python3.11
# with venv, `python` on PATH, CA certificates, Debian's public apt sources) and is passed as
# PYTHON_IMAGE. Where python:3.11-slim-bookworm can be pulled it is the base, unchanged: the
# Dockerfile's defaults stay what users build with (`docker build -f docker/Dockerfile .`).
#
# Why the host's apt and pip configuration is mounted: the registries are reached through
# whatever this machine is configured with (indexes, local wheel folders, certificates). It
# is bind-mounted read-only into each build step (buildah bud --volume) and never copied, so
# no index or registry host is written in the repository or in a layer; the build ends by
# checking every layer for it (scripts/image/layers.py).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
# shellcheck source=scripts/image/env.sh
source scripts/image/env.sh

VARIANT=cpu
CACHE=()
for arg in "$@"; do
    case "$arg" in
        --cuda) VARIANT=cuda ;;
        --no-cache) CACHE=(--no-cache) ;;
        *) echo "usage: $0 [--cuda] [--no-cache]" >&2; exit 2 ;;
    esac
done
# Idempotent: the virtualenv (its python reads pip's configuration and the layers), and
# buildah and mmdebstrap from Debian's packages.
bash scripts/setup.sh
bash scripts/setup_image_tools.sh >/dev/null

WORK="$(mktemp -d /tmp/iris-build.XXXXXX)"
CONTAINERS=()  # working containers, removed however the script ends
cleanup() {
    local ctr
    for ctr in "${CONTAINERS[@]}"; do buildah rm "$ctr" >/dev/null 2>&1 || true; done
    rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

seconds_since() { echo $(( $(date +%s) - $1 )); }

# ---- the base ------------------------------------------------------------------------------
# The recipe's hash is a label on the base: a base built from another recipe is rebuilt, an
# identical one is reused (it only saves time: --no-cache rebuilds it with Debian's newest
# updates).
# mmdebstrap reads the host's apt configuration to fetch packages and writes only the
# sources given here into the root filesystem.
MIRRORS=(
    "deb http://deb.debian.org/debian bookworm main"
    "deb http://deb.debian.org/debian bookworm-updates main"
    "deb http://deb.debian.org/debian-security bookworm-security main"
)
PACKAGES=python3.11,python3.11-venv,python-is-python3,ca-certificates
# Documentation and translations are left out of every package installed, now and by later
# apt-get installs (mmdebstrap keeps these rules in /etc/dpkg/dpkg.cfg.d), as the slim image does.
DPKG_OPTS=(
    --dpkgopt='path-exclude=/usr/share/doc/*'
    --dpkgopt='path-include=/usr/share/doc/*/copyright'
    --dpkgopt='path-exclude=/usr/share/man/*'
    --dpkgopt='path-exclude=/usr/share/info/*'
    --dpkgopt='path-exclude=/usr/share/locale/*'
)
# The base layer's entry in the image history (what `buildah add` would call "ADD file:...").
CREATED_BY="mmdebstrap --variant=minbase --include=$PACKAGES bookworm"
RECIPE="$(printf '%s\n' "$CREATED_BY" "${MIRRORS[@]}" "${DPKG_OPTS[@]}" | sha256sum | cut -c1-16)"

base_recipe() {
    buildah inspect --type image --format '{{index .OCIv1.Config.Labels "dev.iris.recipe"}}' \
        "$BASE_IMAGE" 2>/dev/null || true
}

build_base() {
    local started ctr
    started=$(date +%s)
    echo "build_image: making $BASE_IMAGE with mmdebstrap (Debian bookworm)"
    mmdebstrap --quiet --variant=minbase --include="$PACKAGES" "${DPKG_OPTS[@]}" \
        bookworm "$WORK/rootfs.tar" "${MIRRORS[@]}"
    ctr=$(buildah from scratch)
    CONTAINERS+=("$ctr")
    buildah add --quiet "$ctr" "$WORK/rootfs.tar" / >/dev/null
    rm -f "$WORK/rootfs.tar"
    # What the slim image sets: a UTF-8 locale and a shell command.
    buildah config --env LANG=C.UTF-8 --cmd python3 --created-by "$CREATED_BY" \
        --label "dev.iris.recipe=$RECIPE" "$ctr"
    buildah commit --quiet --rm "$ctr" "$BASE_IMAGE" >/dev/null
    echo "build_image: $BASE_IMAGE built in $(seconds_since "$started") s"
}

if [ "${#CACHE[@]}" -eq 0 ] && [ "$(base_recipe)" = "$RECIPE" ]; then
    echo "build_image: $BASE_IMAGE is current (recipe $RECIPE), reused"
else
    build_base
fi

# ---- the host's configuration, mounted into every build step -------------------------------
# pip: the configuration pip resolves here (files and PIP_* variables), as root's pip.conf,
# and the local paths it names, all mounted below /root (scripts/image/pip_config.py says
# why there). apt: the whole /etc/apt, so the host's sources, keys and options stand in for
# the image's own during the step.
VOLUMES=(--volume "$WORK/pip:/root:ro")
mkdir -p "$WORK/pip"
"$ROOT/.venv/bin/python" scripts/image/pip_config.py "$WORK/pip" >"$WORK/pip-mounts"
while IFS= read -r mount; do
    VOLUMES+=(--volume "$mount:ro")
done <"$WORK/pip-mounts"
[ -d /etc/apt ] && VOLUMES+=(--volume /etc/apt:/etc/apt:ro)

# ---- the image -----------------------------------------------------------------------------
if [ "$VARIANT" = cpu ]; then
    IMAGE="$CPU_IMAGE"
    # Empty: no --index-url flags, so pip's own (mounted) configuration chooses the torch
    # wheel; on these machines that is the CPU build.
    VARIANT_ARGS=(--build-arg TORCH_INDEX_URL= --build-arg VARIANT=cpu)
else
    IMAGE="$CUDA_IMAGE"
    VARIANT_ARGS=()  # the Dockerfile's defaults: PyPI's torch, CUDA libraries included
fi
started=$(date +%s)
echo "build_image: building $IMAGE from docker/Dockerfile on $BASE_IMAGE"
# --layers: steps whose inputs did not change are reused from an earlier build on this
# machine; every step's inputs (files, arguments) are part of its cache key, so a reused layer
# is the one this build would make. The build stage is tagged too (BUILD_CACHE), so that the
# prune below keeps its layers (torch alone is ~0.9 GB to install) and drops earlier builds'.
BUILD_CACHE="localhost/iris-build-stage:${IMAGE##*:}"
# --force-rm: a failed step's working container goes too (CI builds on the same machine).
BUD=(buildah bud --quiet --layers --force-rm -f docker/Dockerfile
    --ignorefile docker/Dockerfile.dockerignore --build-arg "PYTHON_IMAGE=$BASE_IMAGE"
    "${VARIANT_ARGS[@]}" "${VOLUMES[@]}")
# pip warns once per package about each file:// index of the host's that lacks it: hundreds
# of lines that say nothing about this build.
quiet_pip() { grep -v "^WARNING: Location 'file://.*' is ignored" >&2 || true; }
# --no-cache applies to the first: the second reuses the build stage it just made.
"${BUD[@]}" "${CACHE[@]}" --target build -t "$BUILD_CACHE" . >/dev/null 2> >(quiet_pip)
"${BUD[@]}" -t "$IMAGE" . >/dev/null 2> >(quiet_pip)
BUILD_S=$(seconds_since "$started")
# Untagged images are earlier builds' layers: without this, every change of the sources
# leaves ~3.5 GB behind on a machine that builds often (CI).
buildah rmi --prune >/dev/null || echo "build_image: could not prune untagged images" >&2

if [ "$VARIANT" = cuda ]; then
    # The tag is removed when torch has no CUDA: such an image must not be pushed as the GPU one.
    CHECK='import torch, sys; print(torch.__version__); sys.exit(torch.version.cuda is None)'
    ctr=$(buildah from --quiet "$IMAGE")
    CONTAINERS+=("$ctr")
    if ! found=$(buildah run "$ctr" -- python -c "$CHECK"); then
        buildah rm "$ctr" >/dev/null
        buildah rmi "$IMAGE" "$BUILD_CACHE" >/dev/null
        echo "build_image: FAILED: $IMAGE has torch $found, torch.version.cuda is None." >&2
        echo "  pip resolved torch==2.13.0 to a CPU build: this machine's pip configuration" >&2
        echo "  (find-links or an extra index with a +cpu wheel) outranks PyPI's CUDA wheel." >&2
        echo "  Build the CUDA image where PyPI's CUDA torch is what pip installs." >&2
        exit 1
    fi
    buildah rm "$ctr" >/dev/null
fi

# ---- what was built ------------------------------------------------------------------------
# The layers as a registry would receive them (uncompressed): their sizes, and the check that
# no host configuration file went into any of them.
buildah push --quiet --disable-compression "$IMAGE" "dir:$WORK/layers" >/dev/null
# Host configuration: every file under those paths but the ones a Debian package ships and
# the host left unchanged (apt's own defaults, which the image has from the same packages).
debian_default() {
    local pkg
    pkg=$(dpkg -S "$1" 2>/dev/null | head -n1 | cut -d: -f1 | cut -d, -f1) || return 1
    [ -n "$pkg" ] && ! dpkg --verify "$pkg" 2>/dev/null | grep -qF " $1"
}
HOST_CONFIG=()
PIP_FILES=(/etc/pip.conf /etc/xdg/pip "$HOME/.config/pip" "$HOME/.pip" "${PIP_CONFIG_FILE:-}")
for path in "${PIP_FILES[@]}" "$WORK/pip/.config/pip" /etc/apt; do
    [ -e "$path" ] || continue
    while IFS= read -r -d '' file; do
        debian_default "$file" || HOST_CONFIG+=("$file")
    done < <(find "$path" -type f -print0)
done
"$ROOT/.venv/bin/python" scripts/image/layers.py "$WORK/layers" "${HOST_CONFIG[@]}"
echo "build_image: $IMAGE: $(image_size "$IMAGE"), built in $BUILD_S s"
echo "build_image: $BASE_IMAGE: $(image_size "$BASE_IMAGE")"
