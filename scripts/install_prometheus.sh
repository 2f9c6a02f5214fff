#!/usr/bin/env bash
# Installs Debian's prometheus and promtool binaries (2.42) into DEST: the .deb is
# downloaded and unpacked, never installed, so no daemon starts and nothing it recommends
# (node-exporter, the web UI's JavaScript libraries) is pulled in.
set -euo pipefail
DEST="${1:?usage: install_prometheus.sh DEST}"
mkdir -p "$DEST"
DEST="$(cd "$DEST" && pwd)"
TMP="$(mktemp -d)"
trap 'rm -rf "$TMP"' EXIT
cd "$TMP"
# apt-get download writes as the _apt user where it can; a root-owned mktemp folder is fine.
apt-get download -q prometheus 2>/dev/null || apt-get download prometheus
dpkg -x prometheus_*.deb unpacked
for tool in prometheus promtool; do
    install -m 0755 "unpacked/usr/bin/$tool" "$DEST/$tool"
done
"$DEST/promtool" --version | head -1
