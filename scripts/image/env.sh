# Sourced by scripts/build_image.sh and scripts/image_check.sh: one isolation and one set of
# image names for both. Storage is buildah's default (containers-storage, overlay as root
# here): both scripts must see the same store.
# chroot: the isolation that runs without the namespaces and rlimits this sandbox refuses
# (buildah's default, oci through crun, fails here on cgroups).
export BUILDAH_ISOLATION=chroot
VERSION="$(sed -n 's/^appVersion: *"\{0,1\}\([^"]*\)"\{0,1\} *$/\1/p' "$ROOT/helm/iris/Chart.yaml")"
BASE_IMAGE=localhost/iris-python:3.11
# The chart's tags (image.tag and image.cpuTagSuffix) under a local name.
CPU_IMAGE="localhost/iris:$VERSION-cpu"
CUDA_IMAGE="localhost/iris:$VERSION"

image_size() { buildah images --format '{{.Size}}' "$1" | head -n1; }
