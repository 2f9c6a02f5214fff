"""What the chart gives each Iris container, for running the image outside Kubernetes
(scripts/image_check.sh): renders helm/iris with its default values and writes, per component,
the container's environment as KEY=VALUE lines, its arguments, and the gateway's router.yaml.

    python scripts/image/chart_env.py HELM OUT_DIR COMPONENT... --replace NAME...

Writes OUT_DIR/<component>.env, OUT_DIR/<component>.args and OUT_DIR/router/router.yaml.
Variables the chart fills from Kubernetes (`valueFrom`: the pod's name, Secrets) have no value
outside it: each must be named in --replace (the caller sets it), so a new one in the chart
stops the check instead of going missing.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import yaml

CHART = Path(__file__).resolve().parents[2] / "helm" / "iris"


def rendered(helm: str) -> list[dict]:
    text = subprocess.run(
        [helm, "template", "iris", str(CHART)], check=True, capture_output=True, text=True
    ).stdout
    return [doc for doc in yaml.safe_load_all(text) if doc]


def container(docs: list[dict], component: str) -> dict:
    """The component's Iris container in its Deployment."""
    for doc in docs:
        labels = doc.get("metadata", {}).get("labels", {})
        if doc["kind"] == "Deployment" and labels.get("app.kubernetes.io/component") == component:
            (found,) = [
                c for c in doc["spec"]["template"]["spec"]["containers"] if c["name"] == component
            ]
            return found
    raise SystemExit(f"chart_env: no Deployment for component {component!r}")


def router_yaml(docs: list[dict]) -> str:
    for doc in docs:
        if doc["kind"] == "ConfigMap" and "router.yaml" in doc.get("data", {}):
            return doc["data"]["router.yaml"]
    raise SystemExit("chart_env: no ConfigMap with router.yaml")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("helm")
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("components", nargs="+")
    parser.add_argument("--replace", nargs="*", default=[])
    args = parser.parse_args()

    docs = rendered(args.helm)
    for component in args.components:
        spec = container(docs, component)
        lines = []
        for var in spec.get("env", []):
            if "value" in var:
                lines.append(f"{var['name']}={var['value']}")
            elif var["name"] not in args.replace:
                raise SystemExit(
                    f"chart_env: {component} gets {var['name']} from Kubernetes "
                    f"({sorted(var['valueFrom'])}); scripts/image_check.sh must replace it"
                )
        (args.out_dir / f"{component}.env").write_text("\n".join(lines) + "\n")
        (args.out_dir / f"{component}.args").write_text("\n".join(spec["args"]) + "\n")
    router = args.out_dir / "router"
    router.mkdir(exist_ok=True)
    (router / "router.yaml").write_text(router_yaml(docs))
    return 0


if __name__ == "__main__":
    sys.exit(main())
