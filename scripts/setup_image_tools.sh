#!/usr/bin/env bash
# Installs what scripts/build_image.sh and scripts/image_check.sh need, from Debian's packages:
# buildah (builds and runs OCI images without a daemon) and mmdebstrap (a Debian root
# filesystem for the base image). Idempotent; needs root and apt-get.
set -euo pipefail
missing=()
for tool in buildah mmdebstrap; do
    command -v "$tool" >/dev/null 2>&1 || missing+=("$tool")
done
if [ "${#missing[@]}" -gt 0 ]; then
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
        "${missing[@]}" >/dev/null
fi
buildah --version
mmdebstrap --version
