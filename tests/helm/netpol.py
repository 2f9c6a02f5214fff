"""A small evaluator of Kubernetes NetworkPolicy semantics, for asserting flows on rendered
policies: a pod is isolated in a direction once any policy selects it for that direction; a
flow is then allowed when some selecting policy has a rule whose peers and ports match.
Selectors are matchLabels only (the chart uses no matchExpressions; asked for, it raises)."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Endpoint:
    """One side of a flow: a pod (namespace + labels) or an address outside the cluster."""

    namespace: str | None
    labels: dict = field(default_factory=dict, hash=False)
    namespace_labels: dict = field(default_factory=dict, hash=False)
    ip: str = "10.1.2.3"


def selects(selector: dict | None, labels: dict) -> bool:
    if selector is None:
        return False
    if selector.get("matchExpressions"):
        raise NotImplementedError("matchExpressions")
    return all(labels.get(key) == value for key, value in selector.get("matchLabels", {}).items())


def peer_matches(peer: dict, other: Endpoint, policy_namespace: str) -> bool:
    if "ipBlock" in peer:
        block = peer["ipBlock"]
        address = ipaddress.ip_address(other.ip)
        inside = address in ipaddress.ip_network(block["cidr"])
        return inside and not any(
            address in ipaddress.ip_network(cidr) for cidr in block.get("except", [])
        )
    if other.namespace is None:
        return False
    if "namespaceSelector" in peer:
        if not selects(peer["namespaceSelector"], other.namespace_labels):
            return False
    elif other.namespace != policy_namespace:
        return False
    return selects(peer.get("podSelector", {}), other.labels)


def port_matches(ports: list[dict] | None, port: int, protocol: str) -> bool:
    if not ports:
        return True
    return any(
        entry.get("protocol", "TCP") == protocol and entry.get("port") in (None, port)
        for entry in ports
    )


def allowed(
    policies: list[dict],
    pod: Endpoint,
    other: Endpoint,
    port: int,
    direction: str,
    protocol: str = "TCP",
) -> bool:
    """Whether `pod` accepts (Ingress) from / may send (Egress) to `other` on `port`."""
    key, peers_key = ("ingress", "from") if direction == "Ingress" else ("egress", "to")
    selecting = [
        policy
        for policy in policies
        if policy["metadata"].get("namespace", pod.namespace) == pod.namespace
        and selects(policy["spec"]["podSelector"], pod.labels)
        and direction in policy["spec"].get("policyTypes", ["Ingress"])
    ]
    if not selecting:
        return True
    for policy in selecting:
        namespace = policy["metadata"].get("namespace", pod.namespace)
        for rule in policy["spec"].get(key) or []:
            peers = rule.get(peers_key)
            peer_ok = not peers or any(peer_matches(p, other, namespace) for p in peers)
            if peer_ok and port_matches(rule.get("ports"), port, protocol):
                return True
    return False


def flow(policies: list[dict], source: Endpoint, target: Endpoint, port: int) -> bool:
    """A pod-to-pod TCP flow: the source's egress and the target's ingress both allow it."""
    return allowed(policies, source, target, port, "Egress") and allowed(
        policies, target, source, port, "Ingress"
    )
