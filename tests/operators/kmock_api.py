"""The Kubernetes resources the operator needs, declared on kmock's emulated API server
(kmock serves only what a test registers). Shared by the operator's kmock tests and the
dashboard test's operator process."""

from __future__ import annotations

import kmock as kmocklib

NS = "iris"
DEPLOYMENTS = "apps/v1/deployments"
AUTOSCALERS = "iris.dev/v1alpha1/irisautoscalers"
PODS = "v1/pods"


def declare_resources(k8s: kmocklib.KubernetesEmulator) -> None:
    verbs = ["get", "list", "watch", "patch", "create"]
    # kopf waits until namespaces are discoverable even with exact namespace names.
    k8s.resources["v1/namespaces"] = {"kind": "Namespace", "namespaced": False, "verbs": verbs}
    k8s.resources[PODS] = {"kind": "Pod", "namespaced": True, "verbs": verbs}
    k8s.resources["v1/events"] = {"kind": "Event", "namespaced": True, "verbs": verbs}
    k8s.resources[DEPLOYMENTS] = {
        "kind": "Deployment",
        "namespaced": True,
        "verbs": verbs,
        "subresources": ["scale"],
    }
    k8s.resources[AUTOSCALERS] = {
        "kind": "IrisAutoscaler",
        "namespaced": True,
        "verbs": verbs,
        "subresources": ["status"],
    }
